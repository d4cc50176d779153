"""A stand-in for Grafana Pyroscope's HTTP /ingest, for pytrace agent's
tests: it saves every body it takes as DIR/N.pb.gz with DIR/N.json beside
it (the query's name, from, until, format and the auth and tenant headers),
answers 200, and can be told to be down: while DIR/down exists it answers
503 and saves nothing. It prints its port on its first line. Given a
certificate and its key (PEM), it serves HTTPS (tls_serving.py).

    python3 pyroscope_ingest.py DIR [CERT KEY]
"""
import http.server
import json
import os
import sys
import urllib.parse

from tls_serving import serve_tls_if_asked

DIR = sys.argv[1]
COUNT = [0]


class Ingest(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        url = urllib.parse.urlsplit(self.path)
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        if os.path.exists(os.path.join(DIR, "down")):
            self.send_response(503)
            self.end_headers()
            return
        if url.path != "/ingest":
            self.send_response(404)
            self.end_headers()
            return
        query = dict(urllib.parse.parse_qsl(url.query))
        COUNT[0] += 1
        n = COUNT[0]
        with open(os.path.join(DIR, f"{n}.pb.gz"), "wb") as f:
            f.write(body)
        meta = dict(query, authorization=self.headers.get("Authorization"), tenant=self.headers.get("X-Scope-OrgID"))
        with open(os.path.join(DIR, f"{n}.json.tmp"), "w") as f:
            json.dump(meta, f)
        os.rename(os.path.join(DIR, f"{n}.json.tmp"), os.path.join(DIR, f"{n}.json"))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


server = serve_tls_if_asked(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ingest), sys.argv[2:])
print(server.server_address[1], flush=True)
server.serve_forever()
