"""A stand-in for an OpenTelemetry Collector's OTLP profiles receiver over
HTTP/protobuf, for pytrace agent's tests: POST /v1development/profiles
bodies are decoded as ExportProfilesServiceRequest with the OpenTelemetry
project's own Python messages (PyPI's opentelemetry-proto), and each
profile is saved as DIR/N.json: its resource attributes, start and
duration, sample type, and its stacks (function names, leaf first) with
their counts, resolved through the request's dictionary. It answers with
an ExportProfilesServiceResponse. It prints its port on its first line.
Given a certificate and its key (PEM), it serves HTTPS (tls_serving.py).
grpc_profiles.py decodes its gRPC requests with profiles_of from here.

    python3 otlp_profiles.py DIR [CERT KEY]
"""
import http.server
import json
import os
import sys

from tls_serving import serve_tls_if_asked
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2 as service

COUNT = [0]


def value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def profiles_of(request):
    d = request.dictionary
    strings = list(d.string_table)
    for rp in request.resource_profiles:
        attributes = {kv.key: value(kv.value) for kv in rp.resource.attributes}
        for sp in rp.scope_profiles:
            for p in sp.profiles:
                stacks = []
                for s in p.samples:
                    names = []
                    for li in d.stack_table[s.stack_index].location_indices:
                        for line in d.location_table[li].lines:
                            names.append(strings[d.function_table[line.function_index].name_strindex])
                    stacks.append([names, sum(s.values)])
                yield {
                    "attributes": attributes,
                    "scope": sp.scope.name,
                    "time_unix_nano": p.time_unix_nano,
                    "duration_nano": p.duration_nano,
                    "sample_type": [strings[p.sample_type.type_strindex], strings[p.sample_type.unit_strindex]],
                    "period": p.period,
                    "period_type": [strings[p.period_type.type_strindex], strings[p.period_type.unit_strindex]],
                    "stacks": stacks,
                }


class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1development/profiles" or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_response(404)
            self.end_headers()
            return
        request = service.ExportProfilesServiceRequest()
        request.ParseFromString(body)
        for profile in profiles_of(request):
            COUNT[0] += 1
            path = os.path.join(sys.argv[1], f"{COUNT[0]}.json")
            with open(path + ".tmp", "w") as f:
                json.dump(profile, f)
            os.rename(path + ".tmp", path)
        answer = service.ExportProfilesServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    server = serve_tls_if_asked(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver), sys.argv[2:])
    print(server.server_address[1], flush=True)
    server.serve_forever()
