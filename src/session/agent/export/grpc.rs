//! What the gRPC destinations (OTLP's ProfilesService, Parca's
//! ProfileStoreService) share: a tonic channel on a current-thread tokio
//! runtime owned by the destination's push thread (the push loop stays
//! blocking, as the HTTP ones are), TLS with rustls on `https://`, the
//! credentials and tenant as metadata, and which gRPC statuses are worth
//! a retry.

use std::future::Future;

use anyhow::{Context, Result};
use base64::Engine;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::Code;

use super::PushError;
use crate::session::agent::config::{Auth, Remote};

pub struct Grpc {
    runtime: tokio::runtime::Runtime,
    pub channel: Channel,
    metadata: MetadataMap,
}

impl Grpc {
    /// A channel to `url` (http:// or https://), connected on first use
    /// and again after a failure, so a receiver down at startup is a
    /// retry, not a failure to start.
    pub fn new(remote: &Remote) -> Result<Self> {
        let (url, timeout) = (remote.url.as_str(), remote.timeout);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the gRPC client's runtime")?;
        let mut endpoint = Endpoint::from_shared(url.to_string())
            .with_context(|| format!("bad gRPC url {url}"))?
            .connect_timeout(timeout)
            .timeout(timeout)
            .user_agent(concat!("pytrace-agent/", env!("CARGO_PKG_VERSION")))
            .context("bad user agent")?;
        if url.starts_with("https://") {
            let mut tls = ClientTlsConfig::new().with_webpki_roots();
            if let Some(pem) = &remote.ca_pem {
                tls = tls.ca_certificate(Certificate::from_pem(pem));
            }
            endpoint = endpoint.tls_config(tls).with_context(|| format!("cannot set up TLS for {url}"))?;
        }
        // The channel's buffer task is spawned on the runtime it is made in.
        let channel = {
            let _inside = runtime.enter();
            endpoint.connect_lazy()
        };
        Ok(Grpc { runtime, channel, metadata: metadata(&remote.auth, remote.tenant.as_deref())? })
    }

    /// A request carrying the destination's credentials and tenant.
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        *request.metadata_mut() = self.metadata.clone();
        request
    }

    /// Runs one call to its end on this destination's runtime.
    pub fn block_on<F: Future>(&self, call: F) -> F::Output {
        self.runtime.block_on(call)
    }
}

/// `authorization` (bearer or basic, as over HTTP) and `x-scope-orgid`.
fn metadata(auth: &Auth, tenant: Option<&str>) -> Result<MetadataMap> {
    let mut map = MetadataMap::new();
    let authorization = match auth {
        Auth::None => None,
        Auth::Bearer(token) => Some(format!("Bearer {token}")),
        Auth::Basic { user, password } => Some(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))),
    };
    if let Some(value) = authorization {
        map.insert("authorization", MetadataValue::try_from(value).context("the credentials hold a character gRPC metadata cannot carry")?);
    }
    if let Some(tenant) = tenant {
        map.insert("x-scope-orgid", MetadataValue::try_from(tenant).with_context(|| format!("the tenant {tenant:?} holds a character gRPC metadata cannot carry"))?);
    }
    Ok(map)
}

/// A failed call as the push loop takes it: the statuses OTLP's
/// specification calls retryable (and RESOURCE_EXHAUSTED always: a
/// receiver short of room now may have it later) are retried, any other
/// refused.
pub fn push_error(status: tonic::Status) -> PushError {
    let why = if status.message().is_empty() { format!("gRPC {:?}", status.code()) } else { format!("gRPC {:?}: {}", status.code(), status.message()) };
    match status.code() {
        Code::Cancelled | Code::DeadlineExceeded | Code::ResourceExhausted | Code::Aborted | Code::OutOfRange | Code::Unavailable | Code::DataLoss => PushError::Retry(why),
        _ => PushError::Reject(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_become_metadata() {
        let map = metadata(&Auth::Basic { user: "u".into(), password: "p".into() }, Some("team-a")).unwrap();
        assert_eq!(map.get("authorization").unwrap(), "Basic dTpw");
        assert_eq!(map.get("x-scope-orgid").unwrap(), "team-a");
        assert!(matches!(push_error(tonic::Status::unavailable("down")), PushError::Retry(_)));
        assert!(matches!(push_error(tonic::Status::invalid_argument("bad")), PushError::Reject(_)));
    }
}
