#!/usr/bin/env bash
# The programs the tests read pytrace's outputs back with, as a user would:
# Go's pprof (golang-go, `go tool pprof`) and Graphviz for its -svg, for the
# --pprof files; tmux, a terminal for `pytrace top`; Chromium (headless),
# driven by playwright-core, to open --speedscope files in the speedscope app
# (its npm package) and --flamegraph SVGs; snakeviz and gprof2dot for the
# --pstats files; Prometheus, to scrape `pytrace agent`'s /metrics (the test
# starts its own, on a free port, with its own configuration and storage);
# openssl, to make the private CA and server certificate of the agent's TLS
# test.
# Debian's packages, then npm and pip packages at pinned
# versions cached under /var/cache/pytrace/viewers; safe to run again.
#
# Prints nothing on standard output; the tests find the cache at
# $PYTRACE_VIEWERS (default /var/cache/pytrace/viewers).
set -euo pipefail
packages=(golang-go graphviz tmux chromium python3.11-venv prometheus openssl)
# A Node.js from elsewhere (nodesource's bundles npm) will do.
command -v npm >/dev/null || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing the tests' tools: ${missing[*]}" >&2
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
fi

viewers=${PYTRACE_VIEWERS:-/var/cache/pytrace/viewers}
mkdir -p "$viewers"
# The versions are part of the cache's name: changing one installs afresh.
node_packages=(speedscope@1.25.0 playwright-core@1.65.1)
node_stamp="$viewers/node.${node_packages[*]}.done"
node_stamp=${node_stamp// /+}
if [ ! -e "$node_stamp" ]; then
  echo "installing the tests' npm packages: ${node_packages[*]}" >&2
  # playwright-core downloads no browser: the tests point it at Debian's chromium.
  npm install --prefix "$viewers/node" --no-audit --no-fund --loglevel=error "${node_packages[@]}" >&2
  touch "$node_stamp"
fi
pip_packages=(snakeviz==2.2.2 gprof2dot==2025.4.14)
pip_stamp="$viewers/venv.${pip_packages[*]}.done"
pip_stamp=${pip_stamp// /+}
if [ ! -e "$pip_stamp" ]; then
  echo "installing the tests' pip packages: ${pip_packages[*]}" >&2
  rm -rf "$viewers/venv"
  python3.11 -m venv "$viewers/venv"
  "$viewers/venv/bin/pip" install -q --disable-pip-version-check "${pip_packages[@]}" >&2
  touch "$pip_stamp"
fi
# numpy, for sample --native's BLAS test (tests/integration/sample_native.rs): its
# wheel ships OpenBLAS, whose hand-written kernels have no unwind entries.
# A venv of its own over the machine's python3.11, as the viewers' venv.
numpy_packages=(numpy==2.3.5)
numpy_stamp="$viewers/numpy.${numpy_packages[*]}.done"
if [ ! -e "$numpy_stamp" ]; then
  echo "installing the tests' numpy: ${numpy_packages[*]}" >&2
  rm -rf "$viewers/numpy"
  python3.11 -m venv "$viewers/numpy"
  "$viewers/numpy/bin/pip" install -q --disable-pip-version-check --only-binary=:all: "${numpy_packages[@]}" >&2
  touch "$numpy_stamp"
fi
# pytrace agent's OTLP receivers (tests/receivers/otlp_profiles.py over
# HTTP, grpc_profiles.py over gRPC) decode with the OpenTelemetry project's
# own Python messages and servicer: opentelemetry-proto 1.45.2, whose
# profiles messages are those of the Rust crate pytrace encodes with
# (opentelemetry-proto 0.33, OTLP proto v1.10.0), served by grpcio. The
# Parca receiver's messages and servicer are compiled by grpcio-tools from
# Parca's own profilestore.proto (vendored in tests/receivers/proto/),
# which imports Google's HTTP annotations (googleapis-common-protos ships
# their .proto). The stamp names the .proto's hash, so a new one recompiles.
receiver_packages=(opentelemetry-proto==1.45.2 protobuf==7.36.2 grpcio==1.85.1 grpcio-tools==1.85.1 googleapis-common-protos==1.76.0)
receiver_protos="$(cd "$(dirname "$0")/.." && pwd)/tests/receivers/proto"
receiver_proto_hash=$(sha256sum <"$receiver_protos/parca/profilestore/v1alpha1/profilestore.proto" | cut -c1-12)
receiver_stamp="$viewers/receivers.${receiver_packages[*]}.parca-$receiver_proto_hash.done"
receiver_stamp=${receiver_stamp// /+}
if [ ! -e "$receiver_stamp" ]; then
  echo "installing the tests' receivers' pip packages: ${receiver_packages[*]}" >&2
  rm -rf "$viewers/receivers"
  python3.11 -m venv "$viewers/receivers"
  "$viewers/receivers/bin/pip" install -q --disable-pip-version-check "${receiver_packages[@]}" >&2
  site=$("$viewers/receivers/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$viewers/receivers/parca-stubs"
  "$viewers/receivers/bin/python" -m grpc_tools.protoc -I "$receiver_protos" -I "$site" \
    --python_out="$viewers/receivers/parca-stubs" --grpc_python_out="$viewers/receivers/parca-stubs" \
    "$receiver_protos/parca/profilestore/v1alpha1/profilestore.proto" >&2
  touch "$receiver_stamp"
fi
