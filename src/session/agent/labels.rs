//! What a fleet user filters profiles by, per process: its service, the
//! host, its PID and Python version, its container and Kubernetes pod,
//! and the configuration's static labels. Everything here is read from a
//! process that may be hostile: each file read is bounded, and whatever
//! it holds is only ever a label value, cleaned to what a label can be.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;

/// The most read of /proc/PID/environ and /proc/PID/cmdline: an
/// environment can be megabytes; the variables we want are in it or not.
const MAX_PROC_FILE: u64 = 256 << 10;
/// The longest label value kept.
const MAX_VALUE: usize = 200;

/// One process's labels (the static ones are added at export).
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessLabels {
    pub service: String,
    /// Its start time (/proc/PID/stat), to tell it from a later process
    /// given the same PID.
    started: Option<u64>,
    pub labels: BTreeMap<String, String>,
}

/// Labels by PID, read once per process and pruned with it.
#[derive(Default)]
pub struct LabelCache {
    by_pid: HashMap<u32, ProcessLabels>,
    host: String,
}

impl LabelCache {
    pub fn new() -> Self {
        LabelCache { by_pid: HashMap::new(), host: host_name() }
    }

    /// `pid`'s labels, its Python being `version`.
    pub fn get(&mut self, pid: u32, version: &str) -> &ProcessLabels {
        let started = crate::process::proc::start_time(pid).ok();
        // An exited process keeps the labels read while it lived.
        let fresh = self.by_pid.get(&pid).is_some_and(|l| l.started == started || started.is_none());
        if !fresh {
            let labels = read_labels(pid, started, version, &self.host);
            self.by_pid.insert(pid, labels);
        }
        &self.by_pid[&pid]
    }

    /// Forgets the processes not in `alive`.
    pub fn prune(&mut self, alive: impl Fn(u32) -> bool) {
        self.by_pid.retain(|&pid, _| alive(pid));
    }
}

fn read_labels(pid: u32, started: Option<u64>, version: &str, host: &str) -> ProcessLabels {
    let environ = read_proc(pid, "environ");
    let cmdline = read_proc(pid, "cmdline");
    let cgroup = read_proc(pid, "cgroup");
    let service = service_from_environ(&environ).or_else(|| service_from_cmdline(&cmdline)).unwrap_or_else(|| crate::process::proc::command_name(pid));
    let service = clean(&service);
    let mut labels = BTreeMap::new();
    labels.insert("service_name".to_string(), service.clone());
    labels.insert("host".to_string(), clean(host));
    labels.insert("pid".to_string(), pid.to_string());
    labels.insert("python_version".to_string(), clean(version));
    let cgroup = String::from_utf8_lossy(&cgroup);
    if let Some(id) = container_id(&cgroup) {
        labels.insert("container_id".to_string(), id);
    }
    if let Some(uid) = pod_uid(&cgroup) {
        labels.insert("pod_uid".to_string(), uid);
    }
    ProcessLabels { service, started, labels }
}

fn read_proc(pid: u32, file: &str) -> Vec<u8> {
    let mut out = Vec::new();
    if let Ok(f) = std::fs::File::open(format!("/proc/{pid}/{file}")) {
        let _ = f.take(MAX_PROC_FILE).read_to_end(&mut out);
    }
    out
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default()
}

/// OTEL_SERVICE_NAME, else PYROSCOPE_APPLICATION_NAME.
fn service_from_environ(environ: &[u8]) -> Option<String> {
    let vars: Vec<&[u8]> = environ.split(|&b| b == 0).collect();
    ["OTEL_SERVICE_NAME=", "PYROSCOPE_APPLICATION_NAME="].iter().find_map(|key| {
        vars.iter().find_map(|v| v.strip_prefix(key.as_bytes())).map(|v| String::from_utf8_lossy(v).into_owned()).filter(|v| !v.trim().is_empty())
    })
}

/// The script, the `-m` module, or gunicorn's/uvicorn's app.
fn service_from_cmdline(cmdline: &[u8]) -> Option<String> {
    let args: Vec<String> = cmdline.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    let base = |s: &str| s.rsplit('/').next().unwrap_or(s).to_string();
    let program = base(args.first()?);
    if is_server(&program) {
        return server_app(&program, &args[1..]);
    }
    // Python's own options, some of which take a value.
    let mut rest = args[1..].iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "-m" => return rest.next().map(|m| m.to_string()),
            "-c" => return Some(format!("{program} -c")),
            "-X" | "-W" | "-Q" => {
                rest.next();
            }
            a if a.starts_with("-m") && a.len() > 2 => return Some(a[2..].to_string()),
            a if a.starts_with('-') => {}
            script => {
                let name = base(script);
                if is_server(&name) {
                    let at = args.iter().position(|a| a == script).map_or(args.len(), |i| i + 1);
                    return server_app(&name, &args[at..]);
                }
                return Some(name.strip_suffix(".py").unwrap_or(&name).to_string());
            }
        }
    }
    None
}

fn is_server(name: &str) -> bool {
    matches!(name, "gunicorn" | "uvicorn")
}

/// gunicorn's or uvicorn's first argument that is no option: the app
/// (`myproject.wsgi:application`), named without its attribute.
fn server_app(server: &str, args: &[String]) -> Option<String> {
    let app = args.iter().find(|a| !a.starts_with('-') && a.contains(':'))?;
    Some(app.split(':').next().unwrap_or(app).to_string()).filter(|a| !a.is_empty()).or_else(|| Some(server.to_string()))
}

/// A container's 64-hex-digit ID from a cgroup path (docker, containerd,
/// CRI-O and podman all put it in the last part that holds one).
fn container_id(cgroup: &str) -> Option<String> {
    cgroup.lines().rev().filter_map(|line| line.rsplit(':').next()).flat_map(|path| path.rsplit('/')).find_map(hex_run)
}

fn hex_run(part: &str) -> Option<String> {
    let bytes = part.as_bytes();
    (0..bytes.len().saturating_sub(63)).find_map(|i| {
        let run = &bytes[i..i + 64];
        let bounded = (i == 0 || !bytes[i - 1].is_ascii_hexdigit()) && bytes.get(i + 64).is_none_or(|b| !b.is_ascii_hexdigit());
        (bounded && run.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))).then(|| String::from_utf8_lossy(run).into_owned())
    })
}

/// A Kubernetes pod's UID from `kubepods…pod<UID>…` (the systemd driver
/// writes its dashes as underscores).
fn pod_uid(cgroup: &str) -> Option<String> {
    cgroup.split(['/', '\n']).find_map(|part| {
        part.match_indices("pod").find_map(|(at, _)| {
            let uid = part.get(at + 3..at + 39)?.replace('_', "-");
            let ok = uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-') && uid.matches('-').count() == 4;
            ok.then_some(uid)
        })
    })
}

/// A label value: printable, without the characters that end Pyroscope's
/// `name{k=v,…}`, and bounded.
pub fn clean(value: &str) -> String {
    let cleaned: String = value.chars().map(|c| if c.is_control() || matches!(c, '{' | '}' | ',' | '=' | '"') { '_' } else { c }).take(MAX_VALUE).collect();
    if cleaned.is_empty() {
        "unknown".into()
    } else {
        cleaned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(args: &[&str]) -> Option<String> {
        service_from_cmdline(args.join("\0").as_bytes())
    }

    #[test]
    fn service_names() {
        assert_eq!(service_from_environ(b"A=1\0OTEL_SERVICE_NAME=shop\0PYROSCOPE_APPLICATION_NAME=x\0"), Some("shop".into()));
        assert_eq!(service_from_environ(b"PYROSCOPE_APPLICATION_NAME=cart\0"), Some("cart".into()));
        assert_eq!(service_from_environ(b"OTEL_SERVICE_NAME=\0"), None);
        assert_eq!(cmd(&["/usr/bin/python3", "-u", "/srv/app/worker.py", "--x"]), Some("worker".into()));
        assert_eq!(cmd(&["python3", "-X", "dev", "-m", "celery", "worker"]), Some("celery".into()));
        assert_eq!(cmd(&["/venv/bin/gunicorn", "-w", "4", "shop.wsgi:application"]), Some("shop.wsgi".into()));
        assert_eq!(cmd(&["python3", "/venv/bin/uvicorn", "api.main:app", "--port", "80"]), Some("api.main".into()));
        assert_eq!(cmd(&["python3", "-c", "print(1)"]), Some("python3 -c".into()));
    }

    #[test]
    fn container_and_pod() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let docker = format!("0::/system.slice/docker-{id}.scope\n");
        assert_eq!(container_id(&docker), Some(id.to_string()));
        let k8s = format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_0000_1111_2222_333344445555.slice/cri-containerd-{id}.scope\n");
        assert_eq!(container_id(&k8s), Some(id.to_string()));
        assert_eq!(pod_uid(&k8s), Some("1b2c3d4e-0000-1111-2222-333344445555".into()));
        let cgroupfs = "0::/kubepods/besteffort/pod1b2c3d4e-0000-1111-2222-333344445555/abc\n";
        assert_eq!(pod_uid(cgroupfs), Some("1b2c3d4e-0000-1111-2222-333344445555".into()));
        assert_eq!(container_id("0::/user.slice/user-0.slice/session-1.scope\n"), None);
        assert_eq!(clean("a{b}=c,\"d\n"), "a_b__c__d_");
    }
}
