//! Grafana Pyroscope's HTTP ingest: one POST per process and interval to
//! `/ingest?name=SERVICE{k=v,…}&from=S&until=S&format=pprof`, the body the
//! gzipped pprof profile (Pyroscope's own agents send the same). A 2xx is
//! taken, a 429 or 5xx or no answer retried, any other 4xx refused.

use anyhow::{Context, Result};

use super::{Destination, PushError};
use crate::session::agent::config::{Auth, Remote};
use crate::session::agent::Exported;

pub struct Pyroscope {
    client: reqwest::blocking::Client,
    url: reqwest::Url,
    auth: Auth,
    tenant: Option<String>,
}

impl Pyroscope {
    pub fn new(remote: &Remote) -> Result<Self> {
        let url = reqwest::Url::parse(&format!("{}/ingest", remote.url)).with_context(|| format!("bad pyroscope url {}", remote.url))?;
        Ok(Pyroscope { client: super::http_client(remote)?, url, auth: remote.auth.clone(), tenant: remote.tenant.clone() })
    }
}

/// `service{k=v,…}`: the service is the application name, the labels
/// (already cleaned of `{},="`) in braces.
pub fn ingest_name(profile: &Exported) -> String {
    let labels: Vec<String> = profile.labels.iter().filter(|(k, _)| k.as_str() != "service_name").map(|(k, v)| format!("{k}={v}")).collect();
    format!("{}{{{}}}", profile.service, labels.join(","))
}

impl Destination for Pyroscope {
    fn push(&mut self, profile: &Exported) -> Result<(), PushError> {
        let mut url = self.url.clone();
        url.query_pairs_mut()
            .append_pair("name", &ingest_name(profile))
            .append_pair("from", &(profile.start_unix_ns / 1_000_000_000).to_string())
            .append_pair("until", &(profile.end_unix_ns / 1_000_000_000).to_string())
            .append_pair("format", "pprof")
            .append_pair("spyName", "pytrace");
        let request = self.client.post(url).header("Content-Type", "application/octet-stream").body(profile.pprof.clone());
        let response = super::authorized(request, &self.auth, self.tenant.as_deref()).send().map_err(|e| PushError::Retry(format!("{:#}", anyhow::Error::new(e))))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let why = format!("HTTP {status}");
        if status.as_u16() == 429 || status.is_server_error() {
            Err(PushError::Retry(why))
        } else {
            Err(PushError::Reject(why))
        }
    }
}
