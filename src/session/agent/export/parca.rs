//! Parca's `parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw` over
//! gRPC: one call per process and interval, its gzipped pprof as the one
//! raw sample of one series labelled with the process's labels, the
//! profile's name (`__name__`) "process_cpu" as Parca's own scrapers name
//! CPU profiles, and the tenant in the request as well as in
//! `x-scope-orgid`.
//!
//! Its five messages are declared here with prost's derive, field for
//! field those of Parca's published profilestore.proto (vendored for the
//! tests' receiver in tests/receivers/), rather than compiled from the
//! .proto in build.rs: that would need protoc at build time and Google's
//! HTTP annotations it imports, for five small messages that have not
//! changed since v1alpha1 was published. The call goes through tonic's
//! generic unary client.


use anyhow::Result;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

use super::grpc::{self, Grpc};
use super::{Destination, PushError};
use crate::session::agent::config::Remote;
use crate::session::agent::Exported;

const WRITE_RAW: &str = "/parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw";
/// A series' `__name__`: the one Parca gives CPU profiles it scrapes
/// (`process_cpu`), or, for `mode = "wall"`, `wall` (Go's name for
/// wall-clock profiles, as Parca shows them).
fn profile_name(time: &str) -> &'static str {
    match time {
        "wall" => "wall",
        _ => "process_cpu",
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRawRequest {
    #[prost(string, tag = "1")]
    pub tenant: String,
    #[prost(message, repeated, tag = "2")]
    pub series: Vec<RawProfileSeries>,
    #[prost(bool, tag = "3")]
    pub normalized: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRawResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RawProfileSeries {
    #[prost(message, optional, tag = "1")]
    pub labels: Option<LabelSet>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<RawSample>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LabelSet {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RawSample {
    #[prost(bytes = "vec", tag = "1")]
    pub raw_profile: Vec<u8>,
}

pub struct Parca {
    grpc: Grpc,
    client: tonic::client::Grpc<Channel>,
    tenant: String,
}

impl Parca {
    pub fn new(remote: &Remote) -> Result<Self> {
        let grpc = Grpc::new(remote)?;
        let client = tonic::client::Grpc::new(grpc.channel.clone());
        Ok(Parca { grpc, client, tenant: remote.tenant.clone().unwrap_or_default() })
    }
}

/// The series' labels: `__name__`, then the process's (service_name, host,
/// pid, ...) and the configuration's, sorted as Parca keeps them.
fn labels(profile: &Exported) -> LabelSet {
    let mut labels = vec![Label { name: "__name__".into(), value: profile_name(profile.time).into() }];
    if !profile.labels.contains_key("service_name") {
        labels.push(Label { name: "service_name".into(), value: profile.service.clone() });
    }
    labels.extend(profile.labels.iter().map(|(k, v)| Label { name: k.clone(), value: v.clone() }));
    labels.sort_by(|a, b| a.name.cmp(&b.name));
    LabelSet { labels }
}

impl Destination for Parca {
    fn push(&mut self, profile: &Exported) -> Result<(), PushError> {
        // Marked normalized so Parca leaves the addresses alone: Python
        // frames have no machine-code address to make position-independent.
        let message = WriteRawRequest { tenant: self.tenant.clone(), series: vec![RawProfileSeries { labels: Some(labels(profile)), samples: vec![RawSample { raw_profile: profile.pprof.clone() }] }], normalized: true };
        let request = self.grpc.request(message);
        let client = &mut self.client;
        self.grpc
            .block_on(async move {
                client.ready().await.map_err(|e| tonic::Status::unavailable(format!("not connected: {e}")))?;
                client.unary::<_, WriteRawResponse, _>(request, PathAndQuery::from_static(WRITE_RAW), tonic_prost::ProstCodec::default()).await
            })
            .map(|_| ())
            .map_err(grpc::push_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn the_series_is_named_and_labelled() {
        let profile = Exported { interval: 1, time: "cpu", pid: 7, service: "web".into(), labels: BTreeMap::from([("pid".into(), "7".into()), ("env".into(), "ci".into())]), start_unix_ns: 0, end_unix_ns: 0, pprof: vec![], otlp: None };
        let names: Vec<(String, String)> = labels(&profile).labels.into_iter().map(|l| (l.name, l.value)).collect();
        assert_eq!(names, [("__name__", "process_cpu"), ("env", "ci"), ("pid", "7"), ("service_name", "web")].map(|(a, b)| (a.to_string(), b.to_string())));
        let wall = Exported { time: "wall", ..profile };
        assert_eq!(labels(&wall).labels[0].value, "wall");
    }
}
