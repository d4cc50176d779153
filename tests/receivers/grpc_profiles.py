"""A stand-in for the gRPC backends, for pytrace agent's tests: one grpcio
server serving both
- OTLP's opentelemetry.proto.collector.profiles.v1development.ProfilesService
  (an OpenTelemetry Collector's OTLP receiver), with the servicer and
  messages of PyPI's opentelemetry-proto: each profile is saved as
  DIR/otlp/N.json, decoded as otlp_profiles.py does, with the call's
  authorization and x-scope-orgid metadata;
- Parca's parca.profilestore.v1alpha1.ProfileStoreService, compiled from
  Parca's published profilestore.proto (tests/receivers/proto/, compiled by
  scripts/test-tools.sh with grpcio-tools into the venv's parca-stubs): each
  series' raw pprof is gunzipped (so a body that is not gzip is refused),
  saved as DIR/parca/N.pb.gz for Go's pprof reader, and described in
  DIR/parca/N.json: its labels, the request's tenant and normalized flag,
  the metadata, and the pprof's size unzipped.
It prints its port on its first line. Given a certificate and its key
(PEM), it serves gRPC over TLS (grpcio's own server credentials).

    python3 grpc_profiles.py DIR [CERT KEY]
"""
import concurrent.futures
import gzip
import json
import os
import sys
import threading

import grpc

sys.path.insert(0, os.path.join(sys.prefix, "parca-stubs"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2 as otlp_service
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2_grpc as otlp_grpc
from parca.profilestore.v1alpha1 import profilestore_pb2 as parca
from parca.profilestore.v1alpha1 import profilestore_pb2_grpc as parca_grpc

from otlp_profiles import profiles_of

DIR = sys.argv[1]
LOCK = threading.Lock()
COUNTS = {"otlp": 0, "parca": 0}


def save(kind, meta, body=None):
    with LOCK:
        COUNTS[kind] += 1
        n = COUNTS[kind]
        path = os.path.join(DIR, kind, str(n))
        if body is not None:
            with open(path + ".pb.gz", "wb") as f:
                f.write(body)
        # The .json last, renamed into place: a reader that sees it sees
        # the whole of both files.
        with open(path + ".json.tmp", "w") as f:
            json.dump(meta, f)
        os.rename(path + ".json.tmp", path + ".json")


def metadata(context):
    got = dict(context.invocation_metadata())
    return {"authorization": got.get("authorization"), "tenant": got.get("x-scope-orgid")}


class Profiles(otlp_grpc.ProfilesServiceServicer):
    def Export(self, request, context):
        for profile in profiles_of(request):
            profile["metadata"] = metadata(context)
            save("otlp", profile)
        return otlp_service.ExportProfilesServiceResponse()


class ProfileStore(parca_grpc.ProfileStoreServiceServicer):
    def WriteRaw(self, request, context):
        for series in request.series:
            for sample in series.samples:
                try:
                    size = len(gzip.decompress(sample.raw_profile))
                except (OSError, EOFError) as e:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the raw profile is not gzip: {e}")
                meta = {
                    "labels": {label.name: label.value for label in series.labels.labels},
                    "tenant": request.tenant,
                    "normalized": request.normalized,
                    "metadata": metadata(context),
                    "pprof_bytes": size,
                }
                save("parca", meta, sample.raw_profile)
        return parca.WriteRawResponse()


os.makedirs(os.path.join(DIR, "otlp"), exist_ok=True)
os.makedirs(os.path.join(DIR, "parca"), exist_ok=True)
server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
otlp_grpc.add_ProfilesServiceServicer_to_server(Profiles(), server)
parca_grpc.add_ProfileStoreServiceServicer_to_server(ProfileStore(), server)
if len(sys.argv) > 3:
    with open(sys.argv[2], "rb") as cert, open(sys.argv[3], "rb") as key:
        credentials = grpc.ssl_server_credentials([(key.read(), cert.read())])
    port = server.add_secure_port("127.0.0.1:0", credentials)
else:
    port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
server.wait_for_termination()
