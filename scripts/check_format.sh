#!/usr/bin/env bash
# Checks C++ files against .clang-format without changing them (clang-format --dry-run -Werror).
#
#   scripts/check_format.sh            the C++ files changed in the last commit (HEAD~1..HEAD)
#   scripts/check_format.sh BASE       the C++ files changed between BASE and the working tree
#   scripts/check_format.sh --all      every tracked C++ file under the project's source folders
#
# Exits 0 when every file is formatted, 1 when one is not (clang-format names the lines), 2 on
# bad usage, 77 outside a git checkout. CLANG_FORMAT picks the binary (default: clang-format,
# else clang-format-14).
set -euo pipefail

if ! root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel 2>/dev/null); then
  echo "check_format.sh: $(dirname "$0")/..: not a git checkout, so no list of files to check" >&2
  exit 77
fi
cd "$root"

# launch's own code. Tests, examples and benches keep their hand layout: clang-format puts each
# element of a long argv list (a launch command line) on its own line.
folders=(agent launcher common probes rendezvous doctor worker_sdk)
cxx=('*.cc' '*.h' '*.cpp' '*.hpp')

if [[ -n "${CLANG_FORMAT:-}" ]]; then
  clang_format=$CLANG_FORMAT
elif command -v clang-format >/dev/null; then
  clang_format=clang-format
elif command -v clang-format-14 >/dev/null; then
  clang_format=clang-format-14
else
  echo "check_format.sh: clang-format not found (apt-get install clang-format, or set CLANG_FORMAT)" >&2
  exit 2
fi

files=()
if [[ $# -gt 1 ]]; then
  echo "check_format.sh: expected at most one argument (a git revision or --all), got $#" >&2
  exit 2
elif [[ "${1:-}" == "--all" ]]; then
  mapfile -t files < <(git ls-files -- "${folders[@]/%//${cxx[0]}}" "${folders[@]/%//${cxx[1]}}" \
    "${folders[@]/%//${cxx[2]}}" "${folders[@]/%//${cxx[3]}}")
else
  if [[ $# -eq 1 ]]; then
    base=$1
    if ! git rev-parse --verify --quiet "$base^{commit}" >/dev/null; then
      echo "check_format.sh: '$base': expected a git revision or --all" >&2
      exit 2
    fi
    range=("$base")
  elif git rev-parse --verify --quiet HEAD~1 >/dev/null; then
    range=(HEAD~1 HEAD)
  else
    range=(--root HEAD)  # the first commit: all of it
  fi
  # Added, copied, modified or renamed files that still exist; deletions have nothing to check.
  if [[ "${range[0]}" == --root ]]; then
    mapfile -t files < <(git diff-tree --no-commit-id --name-only -r --diff-filter=ACMR --root HEAD -- "${cxx[@]}")
  else
    mapfile -t files < <(git diff --name-only --diff-filter=ACMR "${range[@]}" -- "${cxx[@]}")
  fi
fi

existing=()
for f in "${files[@]}"; do
  [[ -f "$f" && " ${folders[*]} " == *" ${f%%/*} "* ]] && existing+=("$f")
done
if [[ ${#existing[@]} -eq 0 ]]; then
  echo "check_format.sh: no C++ files to check"
  exit 0
fi

if "$clang_format" --style=file --dry-run -Werror "${existing[@]}"; then
  echo "check_format.sh: ${#existing[@]} file(s) formatted"
else
  echo "check_format.sh: some of ${#existing[@]} file(s) need clang-format -i (see above)" >&2
  exit 1
fi
