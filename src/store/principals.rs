//! Organisations, users, groups and memberships.

use rusqlite::{Connection, OptionalExtension, Row};

use super::ExecCached;
use super::{Result, Store, StoreError, json_ids};
use crate::config::Organization;
use crate::model::{Principal, PrincipalKind, Viewer};
use crate::timefmt::now_secs;

const USER: i64 = 1;
const GROUP: i64 = 2;

/// What authentication needs to know of a user, looked up by e-mail.
pub struct Credentials {
    pub token_sha256: Vec<u8>,
    /// Disabled or deleted: refused even with the right token.
    pub refused: bool,
    /// Who the user acts as once the token matches.
    pub viewer: Viewer,
}

/// A new user, as `sitegate user add` asks for it.
pub struct NewUser<'a> {
    pub org: &'a str,
    pub email: &'a str,
    pub name: &'a str,
    pub admin: bool,
    pub prevent_private: bool,
    pub groups: &'a [i64],
    pub token_sha256: &'a [u8],
}

const PRINCIPAL_COLUMNS: &str = "id, kind, org, name, email, admin, prevent_login, prevent_private, deleted";

fn principal_from_row(row: &Row<'_>) -> rusqlite::Result<Principal> {
    Ok(Principal {
        id: row.get(0)?,
        kind: if row.get::<_, i64>(1)? == USER { PrincipalKind::User } else { PrincipalKind::Group },
        org: row.get(2)?,
        name: row.get(3)?,
        email: row.get(4)?,
        admin: row.get(5)?,
        prevent_login: row.get(6)?,
        prevent_private: row.get(7)?,
        deleted: row.get(8)?,
    })
}

impl Store {
    /// Makes the organisations table match the configuration's list (adds, renames; never
    /// removes, so data of an organisation taken out of the config is kept).
    pub fn sync_organizations(&self, orgs: &[Organization]) -> Result<()> {
        self.write(|tx| {
            for o in orgs {
                tx.exec(
                    "INSERT INTO organizations (id, name) VALUES (?1, ?2)
                     ON CONFLICT (id) DO UPDATE SET name = excluded.name",
                    (&o.id, &o.name),
                )?;
            }
            Ok(())
        })
    }

    /// Organisations of the database that `orgs` (the configuration's) leaves out, each with
    /// its users who can log in.
    pub fn organizations_left_out(&self, orgs: &[Organization]) -> Result<Vec<(String, i64)>> {
        let known: Vec<&str> = orgs.iter().map(|o| o.id.as_str()).collect();
        self.read(|tx| {
            let mut stmt = tx.prepare(
                "SELECT o.id, (SELECT count(*) FROM principals p
                               WHERE p.org = o.id AND p.kind = 1 AND p.deleted = 0 AND p.prevent_login = 0)
                 FROM organizations o ORDER BY o.id",
            )?;
            let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
            let mut out = Vec::new();
            for row in rows {
                let (id, users) = row?;
                if !known.contains(&id.as_str()) {
                    out.push((id, users));
                }
            }
            Ok(out)
        })
    }

    /// Administrators who can log in (not deleted, not disabled).
    /// The organisations that have users but no administrator who can log in.
    pub fn orgs_without_admin(&self) -> Result<Vec<String>> {
        self.read(|tx| {
            let mut stmt = tx.prepare(
                "SELECT org FROM principals WHERE kind = 1 AND deleted = 0 GROUP BY org
                 HAVING sum(admin = 1 AND prevent_login = 0) = 0 ORDER BY org",
            )?;
            let orgs = stmt.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<Vec<String>>>()?;
            Ok(orgs)
        })
    }

    pub fn user_count(&self) -> Result<i64> {
        self.read(|tx| Ok(tx.query_row("SELECT count(*) FROM principals WHERE kind = 1", [], |r| r.get(0))?))
    }

    /// A write of users, groups or memberships: counted once it returns, so that this
    /// process's cache of verified credentials forgets what it held before the next request
    /// (`auth::Verified`; other processes' writes reach it through `credentials_version`).
    fn write_credentials<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let result = self.write(f);
        self.local_credential_writes.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        result
    }

    pub fn create_user(&self, u: &NewUser<'_>) -> Result<i64> {
        self.write_credentials(|tx| {
            match email_taken(tx, u.email)? {
                Some(true) => {
                    return Err(StoreError::Duplicate(format!(
                        "a deleted user has e-mail {0} (it stays theirs: their records name them); \
                         `sitegate user undelete --email {0}` brings them back",
                        u.email
                    )));
                }
                Some(false) => {
                    return Err(StoreError::Duplicate(format!("a user with e-mail {} already exists", u.email)));
                }
                None => {}
            }
            for g in u.groups {
                group_in_org(tx, *g, u.org)?;
            }
            tx.exec(
                "INSERT INTO principals (org, kind, name, email, token_sha256, admin, prevent_private, created)
                 VALUES (?1, 1, ?2, ?3, ?4, ?5, ?6, ?7)",
                (u.org, u.name, u.email, u.token_sha256, u.admin, u.prevent_private, now_secs()),
            )?;
            let id = tx.last_insert_rowid();
            for g in u.groups {
                tx.exec("INSERT OR IGNORE INTO memberships (group_id, user_id) VALUES (?1, ?2)", (g, id))?;
            }
            Ok(id)
        })
    }

    /// Replaces a user's token hash (a new token); refuses deleted users.
    pub fn set_token(&self, email: &str, token_sha256: &[u8]) -> Result<()> {
        self.write_credentials(|tx| {
            let n = tx.exec(
                "UPDATE principals SET token_sha256 = ?2 WHERE kind = 1 AND deleted = 0 AND email = ?1 COLLATE NOCASE",
                (email, token_sha256),
            )?;
            if n == 0 { Err(StoreError::NotFound) } else { Ok(()) }
        })
    }

    /// Sets `preventlogin`: the user can no longer call the API. The last administrator of an
    /// organisation who can log in is not disabled.
    pub fn disable_user(&self, email: &str, disabled: bool) -> Result<()> {
        self.write_credentials(|tx| {
            if disabled {
                keep_last_admin(tx, email, "disabled")?;
            }
            let n = tx.exec(
                "UPDATE principals SET prevent_login = ?2 WHERE kind = 1 AND deleted = 0 AND email = ?1 COLLATE NOCASE",
                (email, disabled),
            )?;
            if n == 0 { Err(StoreError::NotFound) } else { Ok(()) }
        })
    }

    /// Marks a user deleted: refused at login, listed by /ownership only with `deleted=1`.
    /// Their records keep their ownership. The last administrator of an organisation who can
    /// log in is not deleted.
    pub fn delete_user(&self, email: &str) -> Result<()> {
        self.write_credentials(|tx| {
            keep_last_admin(tx, email, "deleted")?;
            let n = tx.exec(
                "UPDATE principals SET deleted = 1, token_sha256 = NULL
                 WHERE kind = 1 AND deleted = 0 AND email = ?1 COLLATE NOCASE",
                [email],
            )?;
            if n == 0 { Err(StoreError::NotFound) } else { Ok(()) }
        })
    }

    /// Brings a deleted user back with a new token hash.
    pub fn undelete_user(&self, email: &str, token_sha256: &[u8]) -> Result<()> {
        self.write_credentials(|tx| {
            let n = tx.exec(
                "UPDATE principals SET deleted = 0, token_sha256 = ?2
                 WHERE kind = 1 AND deleted = 1 AND email = ?1 COLLATE NOCASE",
                (email, token_sha256),
            )?;
            if n == 0 { Err(StoreError::NotFound) } else { Ok(()) }
        })
    }

    /// True when a deleted user has this e-mail (it stays theirs: their records name them).
    pub fn user_deleted(&self, email: &str) -> Result<bool> {
        self.read(|tx| {
            Ok(tx
                .query_row(
                    "SELECT 1 FROM principals WHERE kind = 1 AND deleted = 1 AND email = ?1 COLLATE NOCASE",
                    [email],
                    |_| Ok(()),
                )
                .optional()?
                .is_some())
        })
    }

    pub fn create_group(&self, org: &str, name: &str, email: &str) -> Result<i64> {
        self.write_credentials(|tx| {
            let exists: Option<i64> = tx
                .query_row(
                    "SELECT id FROM principals WHERE kind = 2 AND org = ?1 AND deleted = 0 AND name = ?2 COLLATE NOCASE",
                    (org, name),
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(id) = exists {
                return Err(StoreError::Duplicate(format!("group {name:?} already exists with id {id}")));
            }
            tx.exec(
                "INSERT INTO principals (org, kind, name, email, created) VALUES (?1, 2, ?2, ?3, ?4)",
                (org, name, email, now_secs()),
            )?;
            Ok(tx.last_insert_rowid())
        })
    }

    /// Marks a group deleted: its members no longer see its records through it (its
    /// memberships are kept for an undelete). Returns how many live records it owns and how
    /// many members it has, for the operator to be told.
    pub fn delete_group(&self, group_id: i64) -> Result<(i64, i64)> {
        self.write_credentials(|tx| {
            let deleted: Option<bool> = tx
                .query_row("SELECT deleted <> 0 FROM principals WHERE kind = 2 AND id = ?1", [group_id], |r| r.get(0))
                .optional()?;
            match deleted {
                None => Err(StoreError::NotFound),
                Some(true) => Err(StoreError::BadReference(format!("group {group_id} is already deleted"))),
                Some(false) => {
                    tx.exec("UPDATE principals SET deleted = 1 WHERE id = ?1", [group_id])?;
                    let records: i64 = tx.query_row(
                        "SELECT count(*) FROM items WHERE ownership = ?1 AND parent IS NULL AND archived IS NULL",
                        [group_id],
                        |r| r.get(0),
                    )?;
                    let members: i64 =
                        tx.query_row("SELECT count(*) FROM memberships WHERE group_id = ?1", [group_id], |r| r.get(0))?;
                    Ok((records, members))
                }
            }
        })
    }

    /// Brings a deleted group back, with its members and the records it owns; refused while
    /// another live group of its organisation has its name.
    pub fn undelete_group(&self, group_id: i64) -> Result<()> {
        self.write_credentials(|tx| {
            let group: Option<(bool, String, String)> = tx
                .query_row("SELECT deleted <> 0, org, name FROM principals WHERE kind = 2 AND id = ?1", [group_id], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .optional()?;
            let (deleted, org, name) = group.ok_or(StoreError::NotFound)?;
            if !deleted {
                return Err(StoreError::BadReference(format!("group {group_id} is not deleted")));
            }
            let clash: Option<i64> = tx
                .query_row(
                    "SELECT id FROM principals WHERE kind = 2 AND org = ?1 AND deleted = 0 AND name = ?2 COLLATE NOCASE",
                    (&org, &name),
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(other) = clash {
                return Err(StoreError::Duplicate(format!(
                    "group {other} has the name {name:?} now: rename or delete it first"
                )));
            }
            tx.exec("UPDATE principals SET deleted = 0 WHERE id = ?1", [group_id])?;
            Ok(())
        })
    }

    /// Makes a user an administrator, or not; the last administrator of an organisation who
    /// can log in stays one (an organisation without one cannot manage hooks, devices or users
    /// through the API, nor see all its records, and its Alarms get no ticket).
    pub fn set_admin(&self, email: &str, admin: bool) -> Result<()> {
        self.write_credentials(|tx| {
            if !admin {
                keep_last_admin(tx, email, "no longer an administrator")?;
            }
            let n = tx.exec(
                "UPDATE principals SET admin = ?2 WHERE kind = 1 AND deleted = 0 AND email = ?1 COLLATE NOCASE",
                (email, admin),
            )?;
            if n == 0 { Err(StoreError::NotFound) } else { Ok(()) }
        })
    }

    /// Takes a user out of a group.
    pub fn remove_member(&self, group_id: i64, email: &str) -> Result<()> {
        self.write_credentials(|tx| {
            let n = tx.exec(
                "DELETE FROM memberships WHERE group_id = ?1 AND user_id IN
                    (SELECT id FROM principals WHERE kind = 1 AND email = ?2 COLLATE NOCASE)",
                (group_id, email),
            )?;
            if n == 0 {
                return Err(StoreError::BadReference(format!("{email} is not a member of group {group_id}")));
            }
            Ok(())
        })
    }

    /// Adds a user to a group of the same organisation.
    pub fn add_member(&self, group_id: i64, email: &str) -> Result<()> {
        self.write_credentials(|tx| {
            let user: Option<(i64, String)> = tx
                .query_row(
                    "SELECT id, org FROM principals WHERE kind = 1 AND deleted = 0 AND email = ?1 COLLATE NOCASE",
                    [email],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let (user_id, org) =
                user.ok_or_else(|| StoreError::BadReference(format!("no user with e-mail {email}")))?;
            group_in_org(tx, group_id, &org)?;
            tx.exec("INSERT OR IGNORE INTO memberships (group_id, user_id) VALUES (?1, ?2)", (group_id, user_id))?;
            Ok(())
        })
    }

    /// Every user and group, of every organisation (for `sitegate user list`).
    pub fn all_principals(&self) -> Result<Vec<Principal>> {
        self.read(|tx| {
            let mut stmt = tx.prepare(&format!("SELECT {PRINCIPAL_COLUMNS} FROM principals ORDER BY org, kind, id"))?;
            let rows = stmt.query_map([], principal_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// Users and groups of one organisation, for /ownership.
    pub fn ownership(&self, org: &str, include_deleted: bool) -> Result<Vec<Principal>> {
        self.read(|tx| {
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT {PRINCIPAL_COLUMNS} FROM principals WHERE org = ?1 AND (?2 OR deleted = 0) ORDER BY kind, name COLLATE NOCASE, id"
            ))?;
            let rows = stmt.query_map((org, include_deleted), principal_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// A user's credentials and the viewer they act as, in one read (the per-request lookup).
    pub fn credentials(&self, email: &str) -> Result<Option<Credentials>> {
        self.read(|tx| {
            let mut stmt = tx.prepare_cached(
                "SELECT id, token_sha256, prevent_login OR deleted, org, admin, prevent_private FROM principals
                 WHERE kind = 1 AND email = ?1 COLLATE NOCASE",
            )?;
            let row = stmt
                .query_row([email], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, Option<Vec<u8>>>(1)?.unwrap_or_default(),
                        r.get::<_, bool>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, bool>(4)?,
                        r.get::<_, bool>(5)?,
                    ))
                })
                .optional()?;
            let Some((user_id, token_sha256, refused, org, admin, prevent_private)) = row else {
                return Ok(None);
            };
            let groups = groups_of(tx, user_id)?;
            let viewer = Viewer { user_id, org, admin, prevent_private, groups };
            Ok(Some(Credentials { token_sha256, refused, viewer }))
        })
    }
}

/// Whose the e-mail is: nobody's (`None`), a live user's (`Some(false)`), a deleted one's.
fn email_taken(tx: &Connection, email: &str) -> Result<Option<bool>> {
    Ok(tx
        .query_row("SELECT deleted FROM principals WHERE kind = 1 AND email = ?1 COLLATE NOCASE", [email], |r| {
            r.get::<_, bool>(0)
        })
        .optional()?)
}

fn group_in_org(tx: &Connection, group_id: i64, org: &str) -> Result<()> {
    let found = tx
        .query_row(
            "SELECT 1 FROM principals WHERE id = ?1 AND kind = 2 AND deleted = 0 AND org = ?2",
            (group_id, org),
            |_| Ok(()),
        )
        .optional()?;
    found.ok_or_else(|| StoreError::BadReference(format!("no group {group_id} in organisation {org}")))
}

/// The kind of a live (not deleted) user or group of `org`, if `id` is one.
pub(super) fn principal_kind(tx: &Connection, org: &str, id: i64) -> Result<Option<PrincipalKind>> {
    let kind: Option<i64> = tx
        .prepare_cached("SELECT kind FROM principals WHERE id = ?1 AND org = ?2 AND deleted = 0")?
        .query_row((id, org), |r| r.get(0))
        .optional()?;
    Ok(kind.map(|k| if k == GROUP { PrincipalKind::Group } else { PrincipalKind::User }))
}

/// The viewer a live, enabled user acts as (`None` for anyone else).
pub(super) fn viewer_of(tx: &Connection, user_id: i64) -> Result<Option<Viewer>> {
    let row: Option<(String, bool, bool)> = tx
        .prepare_cached(
            "SELECT org, admin, prevent_private FROM principals
             WHERE id = ?1 AND kind = 1 AND deleted = 0 AND prevent_login = 0",
        )?
        .query_row([user_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let Some((org, admin, prevent_private)) = row else { return Ok(None) };
    Ok(Some(Viewer { user_id, org, admin, prevent_private, groups: groups_of(tx, user_id)? }))
}

/// The live groups a user belongs to.
fn groups_of(tx: &Connection, user_id: i64) -> Result<Vec<i64>> {
    let mut stmt = tx.prepare_cached(
        "SELECT m.group_id FROM memberships m JOIN principals g ON g.id = m.group_id
         WHERE m.user_id = ?1 AND g.deleted = 0 ORDER BY m.group_id",
    )?;
    Ok(stmt.query_map([user_id], |r| r.get(0))?.collect::<rusqlite::Result<Vec<i64>>>()?)
}

/// `viewer.owner_ids()` as a JSON array, for visibility clauses.
pub(super) fn owner_ids_json(viewer: &Viewer) -> String {
    json_ids(&viewer.owner_ids())
}

/// Refuses to take away the last administrator of an organisation who can log in (`what`
/// is what would be done to them): disabled, deleted or no longer an administrator.
fn keep_last_admin(tx: &Connection, email: &str, what: &str) -> Result<()> {
    let user: Option<(i64, String, bool)> = tx
        .query_row(
            "SELECT id, org, admin <> 0 AND prevent_login = 0 FROM principals
             WHERE kind = 1 AND deleted = 0 AND email = ?1 COLLATE NOCASE",
            [email],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    let Some((id, org, active_admin)) = user else { return Ok(()) };
    if !active_admin {
        return Ok(());
    }
    let others: i64 = tx.query_row(
        "SELECT count(*) FROM principals
         WHERE kind = 1 AND org = ?2 AND admin = 1 AND deleted = 0 AND prevent_login = 0 AND id <> ?1",
        (id, &org),
        |r| r.get(0),
    )?;
    if others == 0 {
        return Err(StoreError::BadReference(format!(
            "{email} is the last administrator of organisation {org} who can log in: make another one \
             (`sitegate user add --admin --org {org}`, `sitegate user admin`) before this one is {what}"
        )));
    }
    Ok(())
}
