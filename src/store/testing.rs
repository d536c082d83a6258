//! What the store's tests (and others over a real store) set up: a database in a folder of its
//! own, an organisation, and an administrator of it.

use std::path::PathBuf;

use super::{NewUser, Store};
use crate::model::Viewer;

/// A new store in a temporary folder of its own (returned, to remove), with organisation `org`.
pub fn store_with_org(name: &str, org: &str) -> (PathBuf, Store) {
    let dir = std::env::temp_dir().join(format!("sitegate-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::open(&dir.join("site.db")).unwrap();
    store.sync_organizations(&[crate::config::Organization { id: org.into(), name: org.to_uppercase() }]).unwrap();
    (dir, store)
}

/// An administrator of `org`, as the API sees her.
pub fn admin_of(store: &Store, org: &str) -> Viewer {
    let ann = NewUser {
        org,
        email: "ann@acme.test",
        name: "Ann",
        admin: true,
        prevent_private: false,
        groups: &[],
        token_sha256: &[0; 32],
    };
    Viewer {
        user_id: store.create_user(&ann).unwrap(),
        org: org.into(),
        admin: true,
        prevent_private: false,
        groups: vec![],
    }
}
