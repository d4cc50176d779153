//! The agent's configuration: a TOML file (`--config`), flags over it.
//! Every value is checked here, at startup and at each reload, so a bad
//! file is one sentence naming the key, never a failure later. Secrets
//! (tokens, passwords) are never in the file or on the command line: the
//! file names a file that holds them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

/// The largest configuration file read (a bounded read, as for any file).
const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The largest secret file read (a token or a password).
const MAX_SECRET_BYTES: u64 = 64 << 10;
/// The largest CA file read (a bundle of a few hundred certificates).
const MAX_CA_BYTES: u64 = 1 << 20;

/// The agent's settings, checked.
#[derive(Debug, Clone)]
pub struct Config {
    /// Samples per second per CPU: 19 by default, off the round numbers a
    /// timer-driven target would beat with.
    pub hz: u64,
    /// What a sample is: a thread on a CPU (the default), or every thread
    /// at each tick, under its state (`mode = "wall"`).
    pub clock: Clock,
    /// Samples of a thread running an asyncio task go under the task and
    /// those awaiting it, on the Pythons that have them (3.14+).
    pub async_tasks: bool,
    /// How long each exported profile covers.
    pub interval: Duration,
    /// Labels added to every profile.
    pub labels: BTreeMap<String, String>,
    /// Where /metrics is served (None: not served).
    pub metrics_address: Option<String>,
    /// How long SIGTERM waits for the buffers to empty before what is left
    /// is counted as dropped.
    pub flush_timeout: Duration,
    pub destinations: Vec<Destination>,
}

/// One place the profiles go, with its buffer and retry settings.
#[derive(Debug, Clone)]
pub struct Destination {
    /// Its name on /metrics ("pyroscope", or the `name` given).
    pub name: String,
    pub kind: DestinationKind,
    pub buffer: BufferLimits,
    pub retry: RetryPolicy,
}

#[derive(Debug, Clone)]
pub enum DestinationKind {
    /// Rotating pprof files in a local directory, at most `max_bytes` in all.
    Directory { path: PathBuf, max_bytes: u64 },
    /// Grafana Pyroscope's HTTP `/ingest`.
    Pyroscope(Remote),
    /// OTLP profiles over HTTP/protobuf (`URL/v1development/profiles`) or
    /// gRPC (`ProfilesService/Export`).
    Otlp(Remote, OtlpProtocol),
    /// Parca's `ProfileStoreService/WriteRaw` (gRPC).
    Parca(Remote),
}

/// How a destination across the network is reached, whatever its protocol.
#[derive(Debug, Clone)]
pub struct Remote {
    /// http:// or https://, without a trailing '/'.
    pub url: String,
    pub auth: Auth,
    /// Sent as `X-Scope-OrgID` (HTTP) or `x-scope-orgid` (gRPC metadata).
    pub tenant: Option<String>,
    pub timeout: Duration,
    /// `ca_file`'s certificates (PEM, checked), trusted besides the
    /// webpki roots: a private CA's server, over https:// only.
    pub ca_pem: Option<Vec<u8>>,
}

/// What the agent samples: `mode = "cpu"` or `"wall"`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Clock {
    /// The threads a CPU runs, at each tick of that CPU's clock.
    Cpu,
    /// Every thread of every Python at each tick, running or not, under
    /// its state (running with or without the GIL, waiting for the GIL,
    /// released in a named system call): where wall time goes, off-CPU
    /// and GIL waits included.
    Wall,
}

impl Clock {
    /// The profiles' time type: pprof's and OTLP's period type, and the
    /// sample type's second value in pprof.
    pub fn time_type(self) -> &'static str {
        match self {
            Clock::Cpu => "cpu",
            Clock::Wall => "wall",
        }
    }
}

/// How an OTLP destination sends: `protocol = "http"` (the default, port
/// 4318) or `"grpc"` (port 4317).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OtlpProtocol {
    Http,
    Grpc,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Auth {
    None,
    Bearer(String),
    Basic { user: String, password: String },
}

/// How much a destination holds while it cannot take it.
#[derive(Debug, Clone, Copy)]
pub struct BufferLimits {
    pub intervals: usize,
    pub bytes: usize,
}

/// Retries with exponential backoff and jitter.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub initial: Duration,
    pub max: Duration,
}

/// Flags that override the file (cli.rs fills these).
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub hz: Option<u64>,
    pub interval: Option<Duration>,
    pub metrics_address: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    frequency: Option<u64>,
    /// "cpu" (the default) or "wall".
    mode: Option<String>,
    async_tasks: Option<bool>,
    interval: Option<String>,
    flush_timeout: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    metrics: Option<FileMetrics>,
    #[serde(default)]
    destinations: Vec<FileDestination>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileMetrics {
    address: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDestination {
    /// "directory", "pyroscope", "otlp" or "parca".
    kind: String,
    name: Option<String>,
    path: Option<PathBuf>,
    max_size: Option<String>,
    url: Option<String>,
    bearer_token_file: Option<PathBuf>,
    basic_auth_user: Option<String>,
    basic_auth_password_file: Option<PathBuf>,
    tenant: Option<String>,
    timeout: Option<String>,
    buffer_intervals: Option<usize>,
    buffer_size: Option<String>,
    retry_initial: Option<String>,
    retry_max: Option<String>,
    /// An OTLP destination's "http" or "grpc".
    protocol: Option<String>,
    /// PEM certificates of the CA that signed an https:// server's.
    ca_file: Option<PathBuf>,
}

impl Config {
    /// Reads and checks `path` (None: defaults), then applies `flags`.
    pub fn load(path: Option<&Path>, flags: &Overrides) -> Result<Config> {
        let file = match path {
            Some(path) => {
                let text = read_bounded(path, MAX_CONFIG_BYTES, "configuration file")?;
                let text = String::from_utf8(text).map_err(|_| anyhow::anyhow!("the configuration file {} is not UTF-8", path.display()))?;
                parse(&text).with_context(|| format!("bad configuration file {}", path.display()))?
            }
            None => FileConfig::default(),
        };
        let mut config = check(file)?;
        if let Some(hz) = flags.hz {
            config.hz = check_hz(hz)?;
        }
        if let Some(interval) = flags.interval {
            config.interval = check_interval(interval)?;
        }
        if let Some(address) = &flags.metrics_address {
            config.metrics_address = Some(address.clone());
        }
        if config.destinations.is_empty() {
            bail!("no destination is configured: add a [[destinations]] table (kind = \"directory\", \"pyroscope\", \"otlp\" or \"parca\") to the configuration file");
        }
        Ok(config)
    }
}

fn parse(text: &str) -> Result<FileConfig> {
    // toml's message names the line and the key; its first line is enough.
    toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", e.message().trim()))
}

fn check(file: FileConfig) -> Result<Config> {
    let hz = check_hz(file.frequency.unwrap_or(19))?;
    let clock = match file.mode.as_deref() {
        None | Some("cpu") => Clock::Cpu,
        Some("wall") => Clock::Wall,
        Some(other) => bail!("unknown mode {other:?}: it is \"cpu\" (threads on a CPU) or \"wall\" (every thread, with its state)"),
    };
    let interval = check_interval(match &file.interval {
        Some(text) => duration(text, "interval")?,
        None => Duration::from_secs(15),
    })?;
    let flush_timeout = match &file.flush_timeout {
        Some(text) => duration(text, "flush_timeout")?,
        None => Duration::from_secs(10),
    };
    for (key, value) in &file.labels {
        check_label(key, value)?;
    }
    let mut destinations = Vec::new();
    for (i, d) in file.destinations.into_iter().enumerate() {
        let destination = destination(d).with_context(|| format!("destination {}", i + 1))?;
        if destinations.iter().any(|other: &Destination| other.name == destination.name) {
            bail!("two destinations are named {:?}: give each a distinct `name`", destination.name);
        }
        destinations.push(destination);
    }
    Ok(Config { hz, clock, async_tasks: file.async_tasks.unwrap_or(false), interval, labels: file.labels, metrics_address: file.metrics.map(|m| m.address), flush_timeout, destinations })
}

fn destination(d: FileDestination) -> Result<Destination> {
    let buffer = BufferLimits {
        intervals: d.buffer_intervals.unwrap_or(20),
        bytes: match &d.buffer_size {
            Some(text) => size(text, "buffer_size")? as usize,
            None => 64 << 20,
        },
    };
    if buffer.intervals == 0 {
        bail!("buffer_intervals must be at least 1");
    }
    let retry = RetryPolicy {
        initial: d.retry_initial.as_deref().map(|t| duration(t, "retry_initial")).transpose()?.unwrap_or(Duration::from_secs(1)),
        max: d.retry_max.as_deref().map(|t| duration(t, "retry_max")).transpose()?.unwrap_or(Duration::from_secs(30)),
    };
    if retry.initial.is_zero() || retry.max < retry.initial {
        bail!("retry_initial must be above zero and at most retry_max");
    }
    let kind = match d.kind.as_str() {
        "directory" => {
            let path = d.path.context("a directory destination needs `path`")?;
            let max_bytes = match &d.max_size {
                Some(text) => size(text, "max_size")?,
                None => 256 << 20,
            };
            DestinationKind::Directory { path, max_bytes }
        }
        "pyroscope" | "otlp" | "parca" => {
            let protocol = match (d.kind.as_str(), d.protocol.as_deref()) {
                ("otlp", None | Some("http")) => OtlpProtocol::Http,
                ("otlp", Some("grpc")) => OtlpProtocol::Grpc,
                ("otlp", Some(other)) => bail!("unknown otlp protocol {other:?}: it is \"http\" or \"grpc\""),
                (_, Some(_)) => bail!("`protocol` is an otlp destination's key (a {} destination has one protocol)", d.kind),
                (_, None) => OtlpProtocol::Http,
            };
            let example = match (d.kind.as_str(), protocol) {
                ("otlp", OtlpProtocol::Http) => "http://collector:4318",
                ("otlp", OtlpProtocol::Grpc) => "http://collector:4317",
                ("parca", _) => "http://parca:7070",
                _ => "http://pyroscope:4040",
            };
            let url = d.url.with_context(|| format!("a {} destination needs `url` (like \"{example}\")", d.kind))?;
            check_url(&url)?;
            let auth = match (&d.bearer_token_file, &d.basic_auth_user, &d.basic_auth_password_file) {
                (Some(_), Some(_), _) => bail!("give bearer_token_file or basic_auth_user, not both"),
                (Some(file), None, None) => Auth::Bearer(secret(file)?),
                (None, Some(user), Some(file)) => Auth::Basic { user: user.clone(), password: secret(file)? },
                (None, Some(_), None) => bail!("basic_auth_user needs basic_auth_password_file (passwords are read from a file, never written in the configuration)"),
                (_, None, Some(_)) => bail!("basic_auth_password_file needs basic_auth_user"),
                (None, None, None) => Auth::None,
            };
            let timeout = d.timeout.as_deref().map(|t| duration(t, "timeout")).transpose()?.unwrap_or(Duration::from_secs(10));
            let ca_pem = d.ca_file.as_deref().map(|path| trusted_ca(path, &url)).transpose()?;
            let remote = Remote { url: url.trim_end_matches('/').to_string(), auth, tenant: d.tenant, timeout, ca_pem };
            match d.kind.as_str() {
                "otlp" => DestinationKind::Otlp(remote, protocol),
                "parca" => DestinationKind::Parca(remote),
                _ => DestinationKind::Pyroscope(remote),
            }
        }
        other => bail!("unknown destination kind {other:?}: the kinds are \"directory\", \"pyroscope\", \"otlp\" and \"parca\""),
    };
    let name = d.name.unwrap_or_else(|| d.kind.clone());
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        bail!("destination name {name:?} must be letters, digits, '_' or '-'");
    }
    Ok(Destination { name, kind, buffer, retry })
}

fn check_hz(hz: u64) -> Result<u64> {
    if !(1..=1000).contains(&hz) {
        bail!("frequency must be between 1 and 1000 Hz, not {hz}");
    }
    Ok(hz)
}

fn check_interval(interval: Duration) -> Result<Duration> {
    if interval < Duration::from_secs(1) || interval > Duration::from_secs(3600) {
        bail!("interval must be between 1 s and 1 h, not {:?}", interval);
    }
    Ok(interval)
}

fn check_url(url: &str) -> Result<()> {
    let ok = (url.starts_with("http://") || url.starts_with("https://")) && reqwest::Url::parse(url).is_ok();
    if !ok {
        bail!("url {url:?} is not an http:// or https:// URL");
    }
    Ok(())
}

/// A label as Pyroscope and Prometheus take it: `[A-Za-z_][A-Za-z0-9_.]*`
/// keys; values without the characters that end `name{k=v,…}`.
fn check_label(key: &str, value: &str) -> Result<()> {
    let mut chars = key.chars();
    let key_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    if !key_ok {
        bail!("label name {key:?} must start with a letter or '_' and hold only letters, digits, '_' and '.'");
    }
    if value.chars().any(|c| matches!(c, '{' | '}' | ',' | '=' | '"') || c.is_control()) {
        bail!("label {key}'s value {value:?} holds one of {{ }} , = \" or a control character");
    }
    Ok(())
}

/// "15s", "500ms", "2m", "1h".
pub fn duration(text: &str, key: &str) -> Result<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| anyhow::anyhow!("{key} {text:?} is not a duration like \"15s\", \"500ms\" or \"2m\""))?;
    let seconds = match unit.trim() {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => bail!("{key} {text:?} is not a duration like \"15s\", \"500ms\" or \"2m\""),
    };
    if !seconds.is_finite() || seconds > 1e7 {
        bail!("{key} {text:?} is too long");
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// "64MiB", "1GiB", "500KiB", "1000" (bytes).
fn size(text: &str, key: &str) -> Result<u64> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| anyhow::anyhow!("{key} {text:?} is not a size like \"64MiB\""))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => bail!("{key} {text:?} is not a size like \"64MiB\" (units: B, KiB, MiB, GiB)"),
    };
    number.checked_mul(scale).filter(|&n| n > 0).with_context(|| format!("{key} {text:?} must be above zero and below 16 EiB"))
}

/// A secret from its file, whitespace trimmed.
fn secret(path: &Path) -> Result<String> {
    let bytes = read_bounded(path, MAX_SECRET_BYTES, "secret file")?;
    let text = String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("the secret file {} is not UTF-8", path.display()))?;
    let text = text.trim().to_string();
    if text.is_empty() || text.chars().any(char::is_control) {
        bail!("the secret file {} is empty or holds control characters inside the secret", path.display());
    }
    Ok(text)
}

/// `ca_file`'s bytes, once they are known to hold at least one PEM
/// certificate (a file that does not fails the configuration now, not
/// every push later with a TLS error).
fn trusted_ca(path: &Path, url: &str) -> Result<Vec<u8>> {
    if !url.starts_with("https://") {
        bail!("ca_file is for an https:// url, and {url:?} is not one");
    }
    let pem = read_bounded(path, MAX_CA_BYTES, "CA file")?;
    match reqwest::Certificate::from_pem_bundle(&pem) {
        Ok(certificates) if !certificates.is_empty() => Ok(pem),
        _ => bail!("the CA file {} holds no PEM certificate (\"-----BEGIN CERTIFICATE-----\")", path.display()),
    }
}

fn read_bounded(path: &Path, max: u64, what: &str) -> Result<Vec<u8>> {
    crate::process::files::read_local_report(path, max).with_context(|| format!("cannot read the {what} {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes() {
        assert_eq!(duration("15s", "k").unwrap(), Duration::from_secs(15));
        assert_eq!(duration("500ms", "k").unwrap(), Duration::from_millis(500));
        assert_eq!(duration("2m", "k").unwrap(), Duration::from_secs(120));
        assert!(duration("15", "k").is_err());
        assert!(duration("s", "k").is_err());
        assert_eq!(size("64MiB", "k").unwrap(), 64 << 20);
        assert_eq!(size("1000", "k").unwrap(), 1000);
        assert!(size("0", "k").is_err());
        assert!(size("1TB", "k").is_err());
    }

    #[test]
    fn file_is_checked() {
        let config = check(parse("frequency = 97\ninterval = \"3s\"\n[labels]\nenv = \"prod\"\n[[destinations]]\nkind = \"directory\"\npath = \"/tmp/x\"\n").unwrap()).unwrap();
        assert_eq!((config.hz, config.clock, config.async_tasks), (97, Clock::Cpu, false));
        let wall = check(parse("mode = \"wall\"\nasync_tasks = true\n").unwrap()).unwrap();
        assert_eq!((wall.clock, wall.async_tasks), (Clock::Wall, true));
        assert!(format!("{:#}", check(parse("mode = \"off-cpu\"").unwrap()).err().unwrap()).contains("unknown mode"));
        assert_eq!(config.interval, Duration::from_secs(3));
        assert_eq!(config.destinations[0].name, "directory");
        assert!(parse("frequncy = 3").is_err(), "an unknown key is refused");
        assert!(check(parse("[labels]\n\"a b\" = \"x\"").unwrap()).is_err());
        assert!(check(parse("[[destinations]]\nkind = \"pyroscope\"\nurl = \"ftp://x\"").unwrap()).is_err());
        assert!(check(parse("[[destinations]]\nkind = \"kafka\"").unwrap()).is_err());
        let grpc = check(parse("[[destinations]]\nkind = \"otlp\"\nprotocol = \"grpc\"\nurl = \"http://c:4317\"\n[[destinations]]\nkind = \"parca\"\nurl = \"https://p\"").unwrap()).unwrap();
        assert!(matches!(grpc.destinations[0].kind, DestinationKind::Otlp(_, OtlpProtocol::Grpc)));
        assert!(matches!(grpc.destinations[1].kind, DestinationKind::Parca(_)));
        assert!(check(parse("[[destinations]]\nkind = \"otlp\"\nprotocol = \"udp\"\nurl = \"http://c\"").unwrap()).is_err());
        assert!(check(parse("[[destinations]]\nkind = \"parca\"\nprotocol = \"grpc\"\nurl = \"http://c\"").unwrap()).is_err());
    }

    /// A `ca_file` is refused, naming why, for a plain http:// url and for
    /// a file that holds no certificate; tests/integration/agent.rs's TLS
    /// test takes a real one through every protocol.
    #[test]
    fn ca_file_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let not_pem = dir.path().join("ca.pem");
        std::fs::write(&not_pem, "not a certificate\n").unwrap();
        let with = |url: &str| check(parse(&format!("[[destinations]]\nkind = \"pyroscope\"\nurl = \"{url}\"\nca_file = \"{}\"", not_pem.display())).unwrap());
        let error = format!("{:#}", with("http://p:4040").unwrap_err());
        assert!(error.contains("ca_file is for an https:// url"), "{error}");
        let error = format!("{:#}", with("https://p:4040").unwrap_err());
        assert!(error.contains("holds no PEM certificate"), "{error}");
    }
}
