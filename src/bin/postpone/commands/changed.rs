//! The JSON answer of defer, retry, cancel and abort.

use postpone::JobId;
use serde::Serialize;

/// The JSON answer of retry, cancel and abort.
#[derive(Serialize)]
pub struct Changed {
    pub id: JobId,
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub abort: Option<postpone::AbortOutcome>,
}

impl Changed {
    pub fn new(id: JobId, status: &'static str) -> Changed {
        Changed {
            id,
            status,
            deleted: None,
            abort: None,
        }
    }
}
