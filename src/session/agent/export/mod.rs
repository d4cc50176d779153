//! Destinations: one file each, behind `Destination`, and the push thread
//! every destination runs on, taking profiles from its own buffer and
//! retrying with exponential backoff and jitter, so a down or slow
//! destination never holds up the sampler or another destination.

mod directory;
mod grpc;
mod otlp;
mod otlp_grpc;
mod parca;
mod pyroscope;

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::buffer::Buffer;
use super::config::{self, DestinationKind, OtlpProtocol, RetryPolicy};
use super::metrics::{Cause, DestinationMetrics};
use super::Exported;

/// Why a push failed.
pub enum PushError {
    /// Worth another try (network, timeout, 5xx, 429).
    Retry(String),
    /// Refused for good (a 4xx that a retry would get again).
    Reject(String),
}

pub trait Destination: Send {
    fn push(&mut self, profile: &Exported) -> Result<(), PushError>;
}

/// A destination running: its buffer and its push thread.
pub struct Running {
    pub buffer: Arc<Buffer>,
    pub metrics: Arc<DestinationMetrics>,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    /// Makes the destination (a directory is created and checked now) and
    /// starts its push thread.
    pub fn start(config: &config::Destination) -> Result<Running> {
        let destination: Box<dyn Destination> = match &config.kind {
            DestinationKind::Directory { path, max_bytes } => Box::new(directory::Directory::new(path, *max_bytes)?),
            DestinationKind::Pyroscope(remote) => Box::new(pyroscope::Pyroscope::new(remote)?),
            DestinationKind::Otlp(remote, OtlpProtocol::Http) => Box::new(otlp::Otlp::new(remote)?),
            DestinationKind::Otlp(remote, OtlpProtocol::Grpc) => Box::new(otlp_grpc::OtlpGrpc::new(remote)?),
            DestinationKind::Parca(remote) => Box::new(parca::Parca::new(remote)?),
        };
        let metrics = Arc::new(DestinationMetrics::new(&config.name));
        let buffer = Arc::new(Buffer::new(config.buffer, metrics.clone()));
        let (b, m, retry, name) = (buffer.clone(), metrics.clone(), config.retry, config.name.clone());
        let thread = std::thread::Builder::new()
            .name(format!("agent-{name}"))
            .spawn(move || push_loop(destination, &b, &m, retry, &name))
            .with_context(|| format!("cannot start destination {}'s thread", config.name))?;
        Ok(Running { buffer, metrics, thread: Some(thread) })
    }

    /// Delivers what is buffered until `deadline`; what is left then is
    /// dropped, counted.
    pub fn finish(mut self, deadline: Instant) {
        self.buffer.shut_down(deadline);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.buffer.drop_rest();
    }
}

/// The HTTP client of a destination: its timeout, pytrace's user agent,
/// and its `ca_file` trusted besides the webpki roots.
fn http_client(remote: &config::Remote) -> Result<reqwest::blocking::Client> {
    let mut builder = reqwest::blocking::Client::builder().timeout(remote.timeout).user_agent(concat!("pytrace-agent/", env!("CARGO_PKG_VERSION")));
    if let Some(pem) = &remote.ca_pem {
        for certificate in reqwest::Certificate::from_pem_bundle(pem).context("the CA file no longer parses")? {
            builder = builder.add_root_certificate(certificate);
        }
    }
    builder.build().context("cannot make the HTTP client")
}

/// A request with the destination's credentials and tenant header.
fn authorized(request: reqwest::blocking::RequestBuilder, auth: &config::Auth, tenant: Option<&str>) -> reqwest::blocking::RequestBuilder {
    let request = match auth {
        config::Auth::None => request,
        config::Auth::Bearer(token) => request.bearer_auth(token),
        config::Auth::Basic { user, password } => request.basic_auth(user, Some(password)),
    };
    match tenant {
        Some(tenant) => request.header("X-Scope-OrgID", tenant),
        None => request,
    }
}

/// What to do about a failure whose cause is a setting: rustls says
/// "UnknownIssuer" for a server whose certificate no trusted CA signed.
fn hint(why: &str) -> &'static str {
    if why.contains("UnknownIssuer") {
        " (the server's certificate is not signed by a CA the agent trusts: name its CA in the destination's ca_file)"
    } else {
        ""
    }
}

fn push_loop(mut destination: Box<dyn Destination>, buffer: &Buffer, metrics: &DestinationMetrics, retry: RetryPolicy, name: &str) {
    let mut jitter = Jitter::new();
    let mut wait = retry.initial;
    let mut failing = false;
    while let Some(profile) = buffer.front() {
        match destination.push(&profile) {
            Ok(()) => {
                metrics.pushes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                buffer.remove(&profile);
                if failing {
                    crate::console::err(&format!("pytrace agent: destination {name} takes profiles again\n"));
                }
                failing = false;
                wait = retry.initial;
            }
            Err(PushError::Reject(why)) => {
                metrics.failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                metrics.dropped(Cause::Rejected, 1);
                buffer.remove(&profile);
                crate::console::err(&format!("pytrace agent: destination {name} refused a profile of {} (PID {}), dropped: {why}\n", profile.service, profile.pid));
            }
            Err(PushError::Retry(why)) => {
                metrics.failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if !failing {
                    crate::console::err(&format!("pytrace agent: destination {name} failed, retrying with backoff: {why}{}\n", hint(&why)));
                }
                failing = true;
                if !buffer.back_off(jitter.around(wait)) {
                    break;
                }
                wait = (wait * 2).min(retry.max);
            }
        }
    }
}

/// "Full jitter" halved: a wait between half and all of the backoff, so
/// agents restarted together do not retry together.
struct Jitter(u64);

impl Jitter {
    fn new() -> Self {
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) ^ (std::process::id() as u64) << 32;
        Jitter(seed | 1)
    }

    fn around(&mut self, wait: Duration) -> Duration {
        // xorshift64: statistical quality is beside the point here.
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let fraction = 0.5 + (self.0 >> 11) as f64 / (1u64 << 53) as f64 / 2.0;
        wait.mul_f64(fraction)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_between_half_and_all() {
        let mut jitter = Jitter::new();
        for _ in 0..1000 {
            let w = jitter.around(Duration::from_secs(2));
            assert!(w >= Duration::from_secs(1) && w <= Duration::from_secs(2), "{w:?}");
        }
    }
}
