//! HTTPS: rustls, certificate chain and key from PEM files; the one crypto provider of every
//! TLS connection of the service.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The crypto provider of every TLS configuration the service builds (HTTPS, webhooks, the
/// MQTT bridge): aws-lc, which the broker's TLS listener (rmqtt) uses anyway, so the binary
/// carries one provider, not two.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Builds the server configuration; the error names which file is wrong.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, (&'static str, String)> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| ("tls_cert", format!("cannot read certificates from {}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(("tls_cert", format!("{} holds no certificate", cert.display())));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| ("tls_key", format!("cannot read a private key from {}: {e}", key.display())))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| ("tls_cert", e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| ("tls_key", format!("the key does not fit the certificate: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Checks at configuration time that the files make a usable TLS configuration.
pub fn check_files(cert: &Path, key: &Path) -> Result<(), (&'static str, String)> {
    server_config(cert, key).map(|_| ())
}
