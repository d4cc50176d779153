//! OTLP profiles over HTTP/protobuf: one POST per process and interval of
//! an `ExportProfilesServiceRequest` (report/profile/otlp.rs) to
//! `URL/v1development/profiles`, as an OpenTelemetry Collector's OTLP
//! receiver takes it. A 2xx is taken, a 429, 502, 503, 504 or no answer
//! retried (OTLP/HTTP's retryable codes), any other status refused.

use anyhow::{Context, Result};

use super::{Destination, PushError};
use crate::session::agent::config::{Auth, Remote};
use crate::session::agent::Exported;

pub struct Otlp {
    client: reqwest::blocking::Client,
    url: reqwest::Url,
    auth: Auth,
    tenant: Option<String>,
}

impl Otlp {
    pub fn new(remote: &Remote) -> Result<Self> {
        let url = reqwest::Url::parse(&format!("{}/v1development/profiles", remote.url)).with_context(|| format!("bad otlp url {}", remote.url))?;
        Ok(Otlp { client: super::http_client(remote)?, url, auth: remote.auth.clone(), tenant: remote.tenant.clone() })
    }
}

impl Destination for Otlp {
    fn push(&mut self, profile: &Exported) -> Result<(), PushError> {
        let body = profile.otlp.clone().ok_or_else(|| PushError::Reject("no OTLP encoding was made for it".into()))?;
        let request = self.client.post(self.url.clone()).header("Content-Type", "application/x-protobuf").body(body);
        let response = super::authorized(request, &self.auth, self.tenant.as_deref()).send().map_err(|e| PushError::Retry(format!("{:#}", anyhow::Error::new(e))))?;
        let status = response.status();
        match status.as_u16() {
            200..=299 => Ok(()),
            429 | 502 | 503 | 504 => Err(PushError::Retry(format!("HTTP {status}"))),
            _ => Err(PushError::Reject(format!("HTTP {status}"))),
        }
    }
}
