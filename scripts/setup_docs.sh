#!/usr/bin/env bash
# Install the Debian packages the documentation site needs, idempotent:
#   graphviz   `dot` draws the DVC DAG on the pipeline page (make docs)
#   chromium   the headless browser the site test opens pages in (tests/test_docs.py, Playwright with
#              executable_path=/usr/bin/chromium; Playwright's own browser download is not used)
# As root with apt-get, installs what is missing; otherwise says what to install and exits 1 when something is
# missing, so that `make setup` stops with a clear message instead of a test failing later.
set -u
say() { echo "setup_docs: $*"; }
missing=""
command -v dot >/dev/null 2>&1 || missing="$missing graphviz"
[ -x /usr/bin/chromium ] || missing="$missing chromium"
[ -z "$missing" ] && { say "graphviz and chromium already installed"; exit 0; }
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    say "missing Debian packages:$missing (install them as root: apt-get install -y$missing)"
    exit 1
fi
say "installing$missing with apt-get"
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q --no-install-recommends $missing >/dev/null 2>&1; then
    apt-get update -qq >/dev/null 2>&1 || true
    apt-get install -y -q --no-install-recommends $missing >/dev/null 2>&1 || { say "apt-get could not install$missing"; exit 1; }
fi
command -v dot >/dev/null 2>&1 && [ -x /usr/bin/chromium ] || { say "installed, but dot or /usr/bin/chromium is still missing"; exit 1; }
say "installed$missing"
