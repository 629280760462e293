# Sourced by setup.sh and test.sh: apt_install PKG... installs the Debian packages that are missing.
apt_install() {
  command -v apt-get >/dev/null 2>&1 || { echo "setup: no apt-get; install $* yourself" >&2; return 0; }
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "setup: not root and no sudo; install $* yourself" >&2; return 0; }
    sudo="sudo"
  fi
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "setup: apt-get install ${missing[*]}" >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
