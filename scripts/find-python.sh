# Sourced by the scripts in this folder (not run): picks the Python they run and checks it before
# anything starts, so a missing environment costs one line instead of a traceback from deep inside
# train.py. Needs REPO_DIR set; sets PYTHON (an absolute path when it names a file). Call it before any cd.
#   find_python SCRIPT_NAME MODULE...
# PYTHON= wins; else the repository's .venv/bin/python (what `make venv` builds); else python3 on PATH.
find_python() {
  local name="$1" modules="" missing dir
  shift
  if [ -z "${PYTHON:-}" ]; then
    if [ -x "${REPO_DIR}/.venv/bin/python" ]; then PYTHON="${REPO_DIR}/.venv/bin/python"; else PYTHON=python3; fi
  fi
  # A relative path is the caller's (PYTHON=.venv/bin/python from the repository root); the scripts cd.
  case "${PYTHON}" in
    */*) if dir="$(cd "$(dirname "${PYTHON}")" 2> /dev/null && pwd)"; then PYTHON="${dir%/}/${PYTHON##*/}"; fi ;;
  esac
  if ! command -v "${PYTHON}" > /dev/null 2>&1; then
    echo "${name}: no Python at PYTHON=${PYTHON}: run 'make venv' (it builds .venv here), or set PYTHON= to a Python with torch and slime" >&2
    exit 2
  fi
  for m in slime "$@"; do modules="${modules}'${m}',"; done
  # find_spec, not import: importing torch, transformers and ray takes half a minute on a busy 2-core box.
  # The module list is in the code, not in argv, so a PYTHON wrapper that appends arguments still works.
  if ! missing="$(cd "${REPO_DIR}" && "${PYTHON}" -c "import importlib.util as u
print(', '.join(m for m in (${modules}) if u.find_spec(m) is None))" 2> /dev/null)"; then
    echo "${name}: PYTHON=${PYTHON} does not run: run 'make venv' (it builds .venv here), or set PYTHON= to a Python with torch and slime" >&2
    exit 2
  fi
  if [ -n "${missing}" ]; then
    echo "${name}: ${PYTHON} cannot import ${missing}: run 'make venv' (it builds .venv here), or set PYTHON= to a Python that has them" >&2
    exit 2
  fi
}
