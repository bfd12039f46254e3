//! Whom to trust: the rustls client configuration of one connection string.
//!
//! Owns reading the PEM files a string names (`sslrootcert`, `sslcert`, `sslkey`), the
//! system's root store (read once per process and kept), and the certificate verifier rustls
//! lacks, `NoNameCheck`: any certificate for `prefer`/`require` without a root, a chain to a
//! root for `verify-ca` (and for a root file under `prefer`/`require`), never the name;
//! `verify-full` uses webpki's own, with libpq's CN rule added (`NameCheck`). A configuration, once built, does not change.
//!
//! Fails with `Config` for a file that cannot be read, is not PEM, holds no certificate or
//! key, or whose certificate and key do not match, naming the parameter and the path; with
//! `Tls` when the system's store has no usable root or rustls cannot be set up.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::{cn, config_error, Trust};
use crate::error::{Error, ErrorKind, Result};

/// rustls's provider over *ring*. rustls 0.23.48 marks this function deprecated because
/// *ring* has no post-quantum key exchange (X25519MLKEM768 is only in the aws-lc-rs
/// provider). postpone keeps *ring* for the reason docs/crates.md gives (it
/// builds with the C compiler Rust already has), so the deprecation is acknowledged here,
/// in one place; earlier 0.23 releases do not deprecate it, and the `allow` changes nothing
/// for them.
#[allow(deprecated)]
fn ring_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// The rustls configuration shared by every connection of one connection string.
pub(super) fn client_config(
    trust: &Trust,
    check_name: bool,
    client: Option<(&Path, &Path)>,
    sni: bool,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Result<ClientConfig> {
    let provider = Arc::new(ring_provider());
    let algorithms = provider.signature_verification_algorithms;
    let verifier: Arc<dyn ServerCertVerifier> = match trust {
        Trust::Any => Arc::new(NoNameCheck {
            roots: None,
            algorithms,
        }),
        Trust::System | Trust::File(_) => {
            let roots = match trust {
                Trust::File(path) => Arc::new(load_roots(path)?),
                _ => system_roots()?,
            };
            if check_name {
                Arc::new(NameCheck {
                    webpki: WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                        .build()
                        .map_err(|e| Error::with_source(ErrorKind::Tls, "tls: setting up", e))?,
                })
            } else {
                Arc::new(NoNameCheck {
                    roots: Some(roots),
                    algorithms,
                })
            }
        }
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|e| Error::with_source(ErrorKind::Tls, "tls: setting up", e))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certs = load_certs("sslcert", cert)?;
            let key = load_key(key)?;
            builder.with_client_auth_cert(certs, key).map_err(|e| {
                config_error(format_args!(
                    "sslcert {} with sslkey {}: {e}",
                    cert.display(),
                    key_path_display(client)
                ))
            })?
        }
    };
    // PostgreSQL 17 checks ALPN on direct TLS (`sslnegotiation=direct`); older servers ignore it.
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    config.enable_sni = sni;
    Ok(config)
}

fn key_path_display(client: Option<(&Path, &Path)>) -> String {
    client
        .map(|(_, k)| k.display().to_string())
        .unwrap_or_default()
}

/// The system's root certificates, read once per process.
fn system_roots() -> Result<Arc<RootCertStore>> {
    static ROOTS: OnceLock<std::result::Result<Arc<RootCertStore>, String>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                log::debug!("reading the system's root certificates: {e}");
            }
            let mut roots = RootCertStore::empty();
            let (added, ignored) = roots.add_parsable_certificates(found.certs);
            if ignored > 0 {
                log::debug!("{ignored} of the system's root certificates are unusable; skipped");
            }
            if added == 0 {
                let why = found
                    .errors
                    .first()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default();
                return Err(format!(
                    "tls: no root certificate found in the system's store{why}: install the \
                     ca-certificates package, set SSL_CERT_FILE, or give sslrootcert=<file>"
                ));
            }
            Ok(Arc::new(roots))
        })
        .clone()
        .map_err(|m| Error::new(ErrorKind::Tls, m))
}

fn load_roots(path: &Path) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for (i, cert) in load_certs("sslrootcert", path)?.into_iter().enumerate() {
        roots.add(cert).map_err(|e| {
            config_error(format_args!(
                "sslrootcert {}: certificate {} cannot serve as a root: {e}",
                path.display(),
                i + 1
            ))
        })?;
    }
    Ok(roots)
}

fn read_file(what: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        config_error(format_args!(
            "{what} {}: cannot read it: {e}",
            path.display()
        ))
    })
}

fn pem_reason(e: &rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error as Pem;
    match e {
        Pem::MissingSectionEnd { .. } => "a PEM block has no END line".to_owned(),
        Pem::IllegalSectionStart { .. } => "a PEM BEGIN line is malformed".to_owned(),
        Pem::Base64Decode(e) => format!("a PEM block is not valid base64 ({e})"),
        other => other.to_string(),
    }
}

fn load_certs(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let bytes = read_file(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| {
            config_error(format_args!(
                "{what} {}: not a valid PEM file: {}",
                path.display(),
                pem_reason(&e)
            ))
        })?;
    if certs.is_empty() {
        return Err(config_error(format_args!(
            "{what} {}: no certificate in it (expected PEM with BEGIN CERTIFICATE blocks)",
            path.display()
        )));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let bytes = read_file("sslkey", path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
        let why = match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "no private key in it (expected an unencrypted PEM key: PRIVATE KEY, RSA \
                 PRIVATE KEY or EC PRIVATE KEY)"
                    .to_owned()
            }
            other => format!("not a valid PEM file: {}", pem_reason(&other)),
        };
        config_error(format_args!("sslkey {}: {why}", path.display()))
    })
}

/// `verify-full`: webpki's verifier, and libpq's rule that webpki lacks: a certificate
/// without a subjectAltName names its host in the subject's CN.
#[derive(Debug)]
struct NameCheck {
    webpki: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for NameCheck {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        use rustls::CertificateError as C;
        // webpki checks the chain before the name: a name error means a trusted chain.
        match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                C::NotValidForName | C::NotValidForNameContext { .. },
            )) if cn::cn_without_san(end_entity.as_ref()).is_some() => {
                let cn = cn::cn_without_san(end_entity.as_ref()).unwrap_or_default();
                if cn::cn_matches(&cn, server_name) {
                    Ok(ServerCertVerified::assertion())
                } else {
                    Err(rustls::Error::InvalidCertificate(
                        C::NotValidForNameContext {
                            expected: server_name.to_owned(),
                            presented: vec![format!(
                                "{cn} (in its subject CN; it has no subjectAltName)"
                            )],
                        },
                    ))
                }
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// A verifier that never looks at the names in the certificate. Without roots (`prefer` and
/// `require` without a root file) it accepts any certificate, as libpq does; with roots
/// (`verify-ca`, or a root file under `prefer`/`require`) the chain must lead to one. Either
/// way the handshake's signatures are checked, so the session is bound to the key of the
/// certificate shown.
#[derive(Debug)]
struct NoNameCheck {
    roots: Option<Arc<RootCertStore>>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for NoNameCheck {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &cert,
                roots,
                intermediates,
                now,
                self.algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
