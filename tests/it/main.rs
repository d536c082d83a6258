//! Integration tests: the real binary, on a real socket, with its own SQLite file, driven as
//! clients drive it (HTTP and the CLI). One test crate, one `support` module.

mod abuse;
mod access;
mod activities;
mod alerts;
mod bad_input;
mod batch;
mod ble;
mod browser;
mod cli;
mod crash;
mod files;
mod http;
mod list;
mod location;
mod mqtt;
mod ops;
mod records;
mod reports;
mod soak;
mod status;
mod support;
mod upgrade;
mod webhooks;
