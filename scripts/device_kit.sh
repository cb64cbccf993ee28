#!/usr/bin/env bash
# Packs .devkit/ for scripts/device_check.sh, which builds and tests emoe on a GPU machine lent
# through the device tool. That machine's image has CUDA, PyTorch (its libtorch), CMake and ninja
# but not Debian's libraries, and nothing can be downloaded there; the ../shared beside the
# checkout does not travel either. So this script, run here (Debian 12, after scripts/setup.sh):
#   - downloads Debian's packages of emoe's other dependencies (apt-get download: nothing is
#     installed) and unpacks them into .devkit/root, made relocatable (pkg-config files point
#     at their own folder);
#   - copies the parts of ../shared that the golden tests read into .devkit/shared.
# Then, with the device tool:
#   run(command="bash scripts/device_check.sh", carry=[".devkit"], timeout_s=540)
# .devkit/ is ignored by git (.gitignore) and travels only when `carry` names it (64 MiB in all).
set -euo pipefail
cd "$(dirname "$0")/.."

KIT=.devkit
SHARED=${EMOE_SHARED:-../shared}
ARCH=x86_64-linux-gnu

# Headers, CMake/pkg-config files and shared libraries of every dependency in CMakeLists.txt
# except libtorch (the machine's own), oneDNN (CPU only; the build goes without it) and OpenMP
# (the machine's compiler has it); cairo's own runtime dependencies; GoogleTest's static libs;
# pkgconf, for an image without pkg-config.
PACKAGES=(
  libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 libyaml-cpp-dev libyaml-cpp0.7
  nlohmann-json3-dev libcli11-dev libutf8proc-dev libutf8proc2 liblemon-dev liblemon1.3.1 libmetis-dev libmetis5
  libsentencepiece-dev libsentencepiece0 libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libgtest-dev libgmock-dev
  libcairo2-dev libcairo2 libpixman-1-0 libfontconfig1 libfreetype6 libpng16-16 libxcb1
  libxcb-render0 libxcb-shm0 libx11-6 libx11-data libxext6 libxrender1 libxau6 libxdmcp6 libbsd0
  libmd0 libexpat1 libbrotli1
  pkgconf-bin libpkgconf3
)

[ -f "$SHARED/fixtures/README.md" ] || { echo "device_kit: $SHARED/fixtures not found (set EMOE_SHARED)" >&2; exit 2; }

tmp=$(mktemp -d "$PWD/.devkit.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/debs" "$tmp/root" "$tmp/shared"
echo "device_kit: downloading ${#PACKAGES[@]} Debian packages"
# apt's sandbox user must be able to write where the files go
chmod 777 "$tmp/debs"
(cd "$tmp/debs" && apt-get download -q "${PACKAGES[@]}" >/dev/null)
for deb in "$tmp"/debs/*.deb; do dpkg-deb -x "$deb" "$tmp/root"; done
rm -rf "$tmp/debs" "$tmp/root/usr/share/doc" "$tmp/root/usr/share/man" "$tmp/root/usr/share/lintian" \
       "$tmp/root/usr/src" "$tmp/root/usr/share/bug"
# what emoe never links: static libraries other than GoogleTest's, cairo's other libraries,
# expat's wide-character build (sentencepiece.pc names its trainer library too: it stays)
find "$tmp/root" \( -name '*.a' ! -name 'libgtest*' ! -name 'libgmock*' \) -delete
rm -f "$tmp"/root/usr/lib/$ARCH/libcairo-{gobject,script-interpreter}.* \
      "$tmp"/root/usr/lib/$ARCH/libexpatw.*

# a library link left pointing at nothing means a runtime package is missing from the list
dangling=$(cd "$tmp/root" && find . -xtype l)
if [ -n "$dangling" ]; then
  echo "device_kit: links to files no package here provides (add their packages to PACKAGES): $dangling" >&2
  exit 1
fi

# pkg-config files: paths relative to the file itself, and no private requirements (cairo's list
# glib, pixman, fontconfig, ... headers that emoe never includes; linking is dynamic)
for pc in "$tmp"/root/usr/lib/$ARCH/pkgconfig/*.pc "$tmp"/root/usr/share/pkgconfig/*.pc; do
  [ -f "$pc" ] || continue
  case "$pc" in */usr/share/pkgconfig/*) up='${pcfiledir}/../..' ;; *) up='${pcfiledir}/../../..' ;; esac
  sed -i -e "s|^prefix=/usr\$|prefix=$up|" -e "s|^exec_prefix=/usr/bin\$|exec_prefix=\${prefix}|" \
         -e "s|^libdir=/usr/lib\$|libdir=\${prefix}/lib/$ARCH|" -e "s|^includedir=/usr/include\$|includedir=\${prefix}/include|" \
         -e '/^Requires.private/d' "$pc"
done

# ../shared: what the golden tests of models read (models, fixtures); not the datasets, and not
# the tokenizers (those tests run on the CPU alone, here; without their files they skip there)
cp -r "$SHARED/fixtures" "$tmp/shared/fixtures"
rm -rf "$tmp/shared/fixtures/tokenizers"
mkdir -p "$tmp/shared/models/stories260K"
cp -r "$SHARED/models/bert-mini" "$tmp/shared/models/"
cp -r "$SHARED/models/stories260K/hf" "$tmp/shared/models/stories260K/"
chmod -R u+w "$tmp/shared"

rm -rf "$KIT"
mkdir -p "$KIT"
mv "$tmp/root" "$tmp/shared" "$KIT/"
du -sm "$KIT" | awk '{print "device_kit: .devkit is " $1 " MiB (the device tool carries at most 64 MiB with the tree)"}'
