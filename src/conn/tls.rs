//! TLS settings of a connection string (placeholder until TLS lands: only plain connections).

use crate::error::Result;

/// How a connection negotiates TLS.
#[derive(Clone, Debug, Default)]
pub(crate) struct TlsSettings {}

impl TlsSettings {
    /// Takes the TLS parameters that tokio-postgres does not know out of a connection string.
    pub(crate) fn extract(url: &str) -> Result<(String, TlsSettings)> {
        Ok((url.to_owned(), TlsSettings {}))
    }
}

impl TlsSettings {
    /// The TLS connector for one target, or `None` for a plain connection.
    pub(crate) fn connector(
        &self,
        _target: &super::socket::Target,
    ) -> Result<Option<tokio_postgres::NoTls>> {
        Ok(None)
    }
}
