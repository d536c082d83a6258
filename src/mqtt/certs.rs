//! A site CA for MQTT over TLS: `sitegate cert init` makes the CA and the broker's server
//! certificate, `sitegate cert client --org ID --name N` issues a client certificate whose
//! subject O is the organisation (the broker's mutual-TLS listener takes the client's
//! organisation from it). ECDSA P-256 keys (rcgen with aws-lc); private keys are written 0600.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca.key";
pub const SERVER_CERT: &str = "server.pem";
pub const SERVER_KEY: &str = "server.key";

/// The organisational unit that marks a receiver's client certificate.
pub const RECEIVER_OU: &str = "receiver";

const CA_YEARS: i16 = 10;
const LEAF_YEARS: i16 = 5;

/// From yesterday (clocks differ) for `years`; refused while the system clock has not been
/// set.
fn validity(params: &mut CertificateParams, years: i16) -> Result<(), String> {
    let now = jiff::Zoned::now();
    if now.timestamp().as_second() < crate::limits::CLOCK_PLAUSIBLE_FROM_UNIX_S {
        return Err(format!(
            "the system clock says {}: certificates made now would not be valid once it is set; set it (NTP, or `date`) first",
            now.timestamp()
        ));
    }
    let today = now.date();
    let from = today.yesterday().unwrap_or(today);
    let until = from.saturating_add(jiff::Span::new().years(years));
    let ymd = |d: jiff::civil::Date| rcgen::date_time_ymd(i32::from(d.year()), d.month() as u8, d.day() as u8);
    params.not_before = ymd(from);
    params.not_after = ymd(until);
    Ok(())
}

/// Writes `path` whole or not at all (a kill or a power cut left empty keys and a CA
/// certificate that made a second `init` refuse).
fn write(path: &Path, text: &str, private: bool) -> Result<(), String> {
    crate::store::write_whole(path, text.as_bytes(), private)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn err(e: rcgen::Error) -> String {
    format!("certificate: {e}")
}

/// Makes the site CA and the server certificate (for `hosts`: DNS names or IP addresses) in
/// `dir`. Refuses to replace an existing CA unless `force` (every client certificate issued
/// by the old one stops working).
pub fn init(dir: &Path, hosts: &[String], force: bool) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    if dir.join(CA_CERT).exists() && !force {
        return Err(format!(
            "{} exists: a new CA would invalidate every client certificate (use --force to replace it)",
            dir.join(CA_CERT).display()
        ));
    }
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca.distinguished_name.push(DnType::CommonName, "sitegate site CA");
    ca.distinguished_name.push(DnType::OrganizationName, "sitegate");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    validity(&mut ca, CA_YEARS)?;
    let ca_key = KeyPair::generate().map_err(err)?;
    let ca_cert = ca.self_signed(&ca_key).map_err(err)?;
    let issuer = Issuer::new(ca, &ca_key);

    let mut server = CertificateParams::new(hosts.to_vec()).map_err(err)?;
    server.distinguished_name.push(DnType::CommonName, hosts.first().cloned().unwrap_or_else(|| "sitegate".into()));
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    server.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    validity(&mut server, LEAF_YEARS)?;
    let server_key = KeyPair::generate().map_err(err)?;
    let server_cert = server.signed_by(&server_key, &issuer).map_err(err)?;

    // The CA's certificate last: while it is missing, `init` runs again without --force.
    let files = [
        (CA_KEY, ca_key.serialize_pem(), true),
        (SERVER_CERT, server_cert.pem(), false),
        (SERVER_KEY, server_key.serialize_pem(), true),
        (CA_CERT, ca_cert.pem(), false),
    ];
    let mut written = Vec::new();
    for (name, text, private) in files {
        let path = dir.join(name);
        write(&path, &text, private)?;
        written.push(path);
    }
    Ok(written)
}

/// Issues a client certificate (O = the organisation, CN = `name`, OU = receiver for a
/// receiver) signed by the CA in `ca_dir`; writes `{name}.pem` and `{name}.key` into `out`.
pub fn client(ca_dir: &Path, org: &str, name: &str, receiver: bool, out: &Path) -> Result<Vec<PathBuf>, String> {
    let read = |p: PathBuf| {
        std::fs::read_to_string(&p)
            .map_err(|e| format!("cannot read {}: {e} (run `sitegate cert init` first)", p.display()))
    };
    let ca_key = KeyPair::from_pem(&read(ca_dir.join(CA_KEY))?).map_err(err)?;
    let issuer = Issuer::from_ca_cert_pem(&read(ca_dir.join(CA_CERT))?, &ca_key).map_err(err)?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    params.distinguished_name.push(DnType::OrganizationName, org);
    params.distinguished_name.push(DnType::CommonName, name);
    if receiver {
        params.distinguished_name.push(DnType::OrganizationalUnitName, RECEIVER_OU);
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    validity(&mut params, LEAF_YEARS)?;
    let key = KeyPair::generate().map_err(err)?;
    let cert = params.signed_by(&key, &issuer).map_err(err)?;
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let cert_path = out.join(format!("{name}.pem"));
    let key_path = out.join(format!("{name}.key"));
    write(&cert_path, &cert.pem(), false)?;
    write(&key_path, &key.serialize_pem(), true)?;
    Ok(vec![cert_path, key_path])
}
