//! OTLP profiles over gRPC: one `ProfilesService/Export` call per process
//! and interval (the `v1development` service an OpenTelemetry Collector's
//! OTLP receiver serves on port 4317), through the client the
//! opentelemetry-proto crate generates. The request is the one the HTTP
//! destination posts (report/profile/otlp.rs). A partial success that
//! rejected the profile is a refusal.


use anyhow::Result;
use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use prost::Message;
use tonic::transport::Channel;

use super::grpc::{self, Grpc};
use super::{Destination, PushError};
use crate::session::agent::config::Remote;
use crate::session::agent::Exported;

pub struct OtlpGrpc {
    grpc: Grpc,
    client: ProfilesServiceClient<Channel>,
}

impl OtlpGrpc {
    pub fn new(remote: &Remote) -> Result<Self> {
        let grpc = Grpc::new(remote)?;
        let client = ProfilesServiceClient::new(grpc.channel.clone());
        Ok(OtlpGrpc { grpc, client })
    }
}

impl Destination for OtlpGrpc {
    fn push(&mut self, profile: &Exported) -> Result<(), PushError> {
        let body = profile.otlp.as_ref().ok_or_else(|| PushError::Reject("no OTLP encoding was made for it".into()))?;
        // Kept encoded in the buffer (its byte cap counts what it holds);
        // decoding our own encoding back cannot fail short of a bug.
        let message = ExportProfilesServiceRequest::decode(body.as_slice()).map_err(|e| PushError::Reject(format!("its OTLP encoding does not decode: {e}")))?;
        let request = self.grpc.request(message);
        let response = self.grpc.block_on(self.client.export(request)).map_err(grpc::push_error)?;
        match response.into_inner().partial_success {
            Some(partial) if partial.rejected_profiles > 0 => Err(PushError::Reject(format!("the receiver rejected {} profile(s): {}", partial.rejected_profiles, partial.error_message))),
            _ => Ok(()),
        }
    }
}
