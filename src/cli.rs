//! The command line (argh): `serve`, `user ...`, `group ...`, `check-config`. Every
//! subcommand takes `--config PATH` after its name.

use std::path::PathBuf;

use argh::FromArgs;

#[derive(FromArgs, Debug)]
/// sitegate: customer records, location and alerts for a site, in one service.
pub struct Cli {
    /// print the version and exit
    #[argh(switch)]
    pub version: bool,
    #[argh(subcommand)]
    pub command: Option<Command>,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
pub enum Command {
    Serve(Serve),
    User(User),
    Group(Group),
    CheckConfig(CheckConfig),
    Backup(Backup),
    Restore(Restore),
    Compact(Compact),
    Replay(Replay),
    Survey(Survey),
    Record(Record),
    Device(DeviceCmd),
    Locations(Locations),
    Erase(Erase),
    MqttUser(MqttUserCmd),
    Cert(CertCmd),
}

#[derive(FromArgs, Debug)]
/// Certificates for MQTT over TLS: the site CA, the broker's certificate, client certificates.
#[argh(subcommand, name = "cert")]
pub struct CertCmd {
    #[argh(subcommand)]
    pub command: CertCommand,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
pub enum CertCommand {
    Init(CertInit),
    Client(CertClient),
}

#[derive(FromArgs, Debug)]
/// Make the site CA and the broker's server certificate (ca.pem, ca.key, server.pem, server.key).
#[argh(subcommand, name = "init")]
pub struct CertInit {
    /// configuration file (the certificates go to `certs/` next to it unless --dir)
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// directory for the files
    #[argh(option)]
    pub dir: Option<PathBuf>,
    /// a name or address clients use to reach the gateway (repeatable; default: localhost,
    /// 127.0.0.1 and this host's name)
    #[argh(option)]
    pub host: Vec<String>,
    /// replace an existing CA (every client certificate it issued stops working)
    #[argh(switch)]
    pub force: bool,
}

#[derive(FromArgs, Debug)]
/// Issue a client certificate for an organisation (NAME.pem and NAME.key).
#[argh(subcommand, name = "client")]
pub struct CertClient {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// the directory of the site CA (default: `certs/` next to the configuration file)
    #[argh(option)]
    pub dir: Option<PathBuf>,
    /// organisation id
    #[argh(option)]
    pub org: String,
    /// the client's name (1..64 letters, digits, '.', '-', '_'): its certificate's CN
    #[argh(option)]
    pub name: String,
    /// a remote BLE receiver: may also publish adverts
    #[argh(switch)]
    pub receiver: bool,
    /// where to write the files (default: the CA's directory)
    #[argh(option)]
    pub out: Option<PathBuf>,
}

#[derive(FromArgs, Debug)]
/// MQTT credentials: each belongs to one organisation and may use only its topics.
#[argh(subcommand, name = "mqtt-user")]
pub struct MqttUserCmd {
    #[argh(subcommand)]
    pub command: MqttUserCommand,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
pub enum MqttUserCommand {
    Add(MqttUserAdd),
    List(MqttUserList),
    Delete(MqttUserDelete),
}

#[derive(FromArgs, Debug)]
/// Create MQTT credentials and print the password (shown once; stored hashed).
#[argh(subcommand, name = "add")]
pub struct MqttUserAdd {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// organisation id
    #[argh(option)]
    pub org: String,
    /// username (1..128 characters)
    #[argh(option)]
    pub username: String,
    /// credentials of a remote BLE receiver: may also publish adverts
    #[argh(switch)]
    pub receiver: bool,
}

#[derive(FromArgs, Debug)]
/// List MQTT users (username, organisation, receiver).
#[argh(subcommand, name = "list")]
pub struct MqttUserList {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
}

#[derive(FromArgs, Debug)]
/// Delete MQTT credentials (clients connected with them keep their connection until it ends).
#[argh(subcommand, name = "delete")]
pub struct MqttUserDelete {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// username
    #[argh(option)]
    pub username: String,
}

#[derive(FromArgs, Debug)]
/// Write the adverts the BLE adapter hears to a trace file (JSON Lines) until interrupted.
#[argh(subcommand, name = "record")]
pub struct Record {
    /// configuration file: [location] adapter and scan_watchdog_s
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// the trace file to write (- for standard output)
    #[argh(option)]
    pub out: PathBuf,
    /// stop after this many seconds (default: until SIGINT or SIGTERM)
    #[argh(option)]
    pub seconds: Option<u64>,
}

#[derive(FromArgs, Debug)]
/// Manage tracked devices (tags); works while the service runs.
#[argh(subcommand, name = "device")]
pub struct DeviceCmd {
    #[argh(subcommand)]
    pub command: DeviceCommand,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
pub enum DeviceCommand {
    Add(DeviceAdd),
    Import(DeviceImport),
    List(DeviceList),
    Delete(DeviceDelete),
}

#[derive(FromArgs, Debug)]
/// Register a device and print its id.
#[argh(subcommand, name = "add")]
pub struct DeviceAdd {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// the device address: three integers a/b/c
    #[argh(option)]
    pub address: String,
    /// how it is recognised: ibeacon:UUID/MAJOR/MINOR, eddystone:NAMESPACE/INSTANCE or mac:AA:BB:CC:DD:EE:FF
    #[argh(option)]
    pub beacon: String,
    /// topic-safe id used in MQTT (default: the address with . for /)
    #[argh(option)]
    pub deviceid: Option<String>,
    /// a label
    #[argh(option, default = "String::new()")]
    pub label: String,
    /// a tag type id of the site map
    #[argh(option)]
    pub tagtype: Option<i64>,
    /// the contact (record id) who carries it
    #[argh(option)]
    pub contact: Option<i64>,
    /// organisation id (default: the first in the configuration)
    #[argh(option)]
    pub org: Option<String>,
}

#[derive(FromArgs, Debug)]
/// Register devices from CSV (deviceaddress,deviceid,label,tagtype,beacon,contactid): all or none.
#[argh(subcommand, name = "import")]
pub struct DeviceImport {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// the CSV file
    #[argh(positional)]
    pub file: PathBuf,
    /// organisation id (default: the first in the configuration)
    #[argh(option)]
    pub org: Option<String>,
}

#[derive(FromArgs, Debug)]
/// List devices as CSV (the import format, with the id and organisation first).
#[argh(subcommand, name = "list")]
pub struct DeviceList {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
}

#[derive(FromArgs, Debug)]
/// Delete a device with its location history.
#[argh(subcommand, name = "delete")]
pub struct DeviceDelete {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// device id
    #[argh(option)]
    pub id: i64,
    /// organisation id (default: the first in the configuration)
    #[argh(option)]
    pub org: Option<String>,
}

#[derive(FromArgs, Debug)]
/// Erase a deleted record for good (personal data): the record, its activities and their
/// files, its tags, its links to and from other records, its indexed values and the webhook
/// deliveries about them (sent or not: it says how many were not sent). It must have
/// been deleted first (`DELETE /contacts/ID`); until erased it can be restored. A contact's
/// location history and visits go with her (`sitegate locations --purge` forgets them
/// without erasing the contact); backups made before keep it all.
#[argh(subcommand, name = "erase")]
pub struct Erase {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// the record's type: contacts, companies, projectblogs or tickets
    #[argh(option, long = "type")]
    pub record_type: String,
    /// the record's id
    #[argh(option)]
    pub id: i64,
}

#[derive(FromArgs, Debug)]
/// A contact's location data (personal data): print it as JSON, or forget it.
#[argh(subcommand, name = "locations")]
pub struct Locations {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// the contact's record id
    #[argh(option)]
    pub contact: i64,
    /// forget the history, visits and last position of the contact's devices (a device in a
    /// zone now stays placed there, as if it had entered at the purge)
    #[argh(switch)]
    pub purge: bool,
    /// organisation id (default: the first in the configuration)
    #[argh(option)]
    pub org: Option<String>,
}

#[derive(FromArgs, Debug)]
/// Run an advert trace (JSON Lines) through the zone engine offline; print one JSON line per
/// zone decision.
#[argh(subcommand, name = "replay")]
pub struct Replay {
    /// configuration file: the site map and [location] settings
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// the trace to replay (- for standard input)
    #[argh(option)]
    pub trace: PathBuf,
    /// devices as CSV (deviceaddress,deviceid,label,tagtype,beacon,contactid); default: the
    /// devices registered in the database
    #[argh(option)]
    pub devices: Option<PathBuf>,
    /// write the decisions, visits and history into the database (with its devices; the
    /// service must be stopped) instead of printing them
    #[argh(switch)]
    pub store: bool,
}

#[derive(FromArgs, Debug)]
/// Zone fingerprints from a survey: a trace recorded while a tag was carried through each
/// zone, and the times it was in which (marks); prints a `fingerprints = [...]` block per
/// zone for the site map.
#[argh(subcommand, name = "survey")]
pub struct Survey {
    /// configuration file: the site map and [location] settings
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// the trace recorded during the survey (sitegate record)
    #[argh(option)]
    pub trace: PathBuf,
    /// CSV lines zoneid,from,until (Unix milliseconds, RFC 3339, or local times of the site's
    /// time zone such as 2026-11-23 10:15:00): when the tag was in which zone
    #[argh(option)]
    pub marks: PathBuf,
    /// the survey tag's deviceaddress (a/b/c)
    #[argh(option)]
    pub device: String,
    /// devices as CSV (as for replay); default: the devices registered in the database
    #[argh(option)]
    pub devices: Option<PathBuf>,
}

#[derive(FromArgs, Debug)]
/// Copy the database to FILE, consistently, also while the service runs.
#[argh(subcommand, name = "backup")]
pub struct Backup {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// where to write the copy
    #[argh(option)]
    pub out: PathBuf,
}

#[derive(FromArgs, Debug)]
/// Replace the database with a backup (stop the service first; the current database is kept).
#[argh(subcommand, name = "restore")]
pub struct Restore {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// the backup to restore
    #[argh(option)]
    pub from: PathBuf,
}

#[derive(FromArgs, Debug)]
/// Give the space of purged and deleted data back to the disk (stop the service first; needs
/// room for two more copies of the database while it runs).
#[argh(subcommand, name = "compact")]
pub struct Compact {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
}

#[derive(FromArgs, Debug)]
/// Run the service.
#[argh(subcommand, name = "serve")]
pub struct Serve {
    /// configuration file (default: ./config.toml if present, else built-in defaults)
    #[argh(option)]
    pub config: Option<PathBuf>,
}

#[derive(FromArgs, Debug)]
/// Validate the configuration and print it resolved.
#[argh(subcommand, name = "check-config")]
pub struct CheckConfig {
    /// configuration file (default: ./config.toml if present, else built-in defaults)
    #[argh(option)]
    pub config: Option<PathBuf>,
}

#[derive(FromArgs, Debug)]
/// Manage users (works while the service runs).
#[argh(subcommand, name = "user")]
pub struct User {
    #[argh(subcommand)]
    pub command: UserCommand,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
pub enum UserCommand {
    Add(UserAdd),
    Token(UserToken),
    List(UserList),
    Disable(UserDisable),
    Enable(UserEnable),
    Delete(UserDelete),
    Undelete(UserUndelete),
    Admin(UserAdmin),
}

#[derive(FromArgs, Debug)]
/// Make a user an administrator (or, with --revoke, no longer one; an organisation's last
/// administrator who can log in stays one).
#[argh(subcommand, name = "admin")]
pub struct UserAdmin {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// the user's e-mail address
    #[argh(option)]
    pub email: String,
    /// take the administrator's rights away instead
    #[argh(switch)]
    pub revoke: bool,
}

#[derive(FromArgs, Debug)]
/// Create a user and print its API token (shown once).
#[argh(subcommand, name = "add")]
pub struct UserAdd {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// e-mail address, the login name
    #[argh(option)]
    pub email: String,
    /// display name
    #[argh(option)]
    pub name: String,
    /// administrator: sees and changes every record of the organisation
    #[argh(switch)]
    pub admin: bool,
    /// group id to join (repeatable)
    #[argh(option)]
    pub group: Vec<i64>,
    /// organisation id (default: the first in the configuration)
    #[argh(option)]
    pub org: Option<String>,
    /// the user may not own private records (ownership must be a group)
    #[argh(switch)]
    pub prevent_private_data: bool,
}

#[derive(FromArgs, Debug)]
/// Issue a new API token for a user (the old one stops working).
#[argh(subcommand, name = "token")]
pub struct UserToken {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// the user's e-mail address
    #[argh(option)]
    pub email: String,
}

#[derive(FromArgs, Debug)]
/// List users.
#[argh(subcommand, name = "list")]
pub struct UserList {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
}

#[derive(FromArgs, Debug)]
/// Stop a user from calling the API (preventlogin).
#[argh(subcommand, name = "disable")]
pub struct UserDisable {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// the user's e-mail address
    #[argh(option)]
    pub email: String,
}

#[derive(FromArgs, Debug)]
/// Let a disabled user call the API again.
#[argh(subcommand, name = "enable")]
pub struct UserEnable {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// the user's e-mail address
    #[argh(option)]
    pub email: String,
}

#[derive(FromArgs, Debug)]
/// Delete a user: refused at login, left out of GET /ownership unless deleted=1 (`user list`
/// flags it); records keep their owner.
#[argh(subcommand, name = "delete")]
pub struct UserDelete {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// the user's e-mail address
    #[argh(option)]
    pub email: String,
}

#[derive(FromArgs, Debug)]
/// Bring a deleted user back, with their records, and print a new API token (shown once).
#[argh(subcommand, name = "undelete")]
pub struct UserUndelete {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// the user's e-mail address
    #[argh(option)]
    pub email: String,
}

#[derive(FromArgs, Debug)]
/// Manage groups (works while the service runs).
#[argh(subcommand, name = "group")]
pub struct Group {
    #[argh(subcommand)]
    pub command: GroupCommand,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
pub enum GroupCommand {
    Add(GroupAdd),
    Member(GroupMember),
    List(GroupList),
    Delete(GroupDelete),
    Undelete(GroupUndelete),
}

#[derive(FromArgs, Debug)]
/// Create a group and print its id.
#[argh(subcommand, name = "add")]
pub struct GroupAdd {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// group name
    #[argh(option)]
    pub name: String,
    /// group e-mail address
    #[argh(option)]
    pub email: Option<String>,
    /// organisation id (default: the first in the configuration)
    #[argh(option)]
    pub org: Option<String>,
}

#[derive(FromArgs, Debug)]
/// Add a user to a group (or, with --remove, take them out of it).
#[argh(subcommand, name = "member")]
pub struct GroupMember {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// group id
    #[argh(option)]
    pub group: i64,
    /// the user's e-mail address
    #[argh(option)]
    pub email: String,
    /// take the user out of the group instead
    #[argh(switch)]
    pub remove: bool,
}

#[derive(FromArgs, Debug)]
/// List groups.
#[argh(subcommand, name = "list")]
pub struct GroupList {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
}

#[derive(FromArgs, Debug)]
/// Delete a group (left out of GET /ownership unless deleted=1). Its records keep it as
/// their owner, and its members no longer see them through it; prints how many of each.
#[argh(subcommand, name = "delete")]
pub struct GroupDelete {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// group id
    #[argh(option)]
    pub group: i64,
}

#[derive(FromArgs, Debug)]
/// Bring a deleted group back, with its members and its records.
#[argh(subcommand, name = "undelete")]
pub struct GroupUndelete {
    /// configuration file
    #[argh(option)]
    pub config: Option<PathBuf>,
    /// group id
    #[argh(option)]
    pub group: i64,
}
