#!/usr/bin/env bash
# Our container image, built without any container registry and imported into the one-node
# cluster of deploy/local/node.sh (its pods use it with imagePullPolicy: Never).
#
#   deploy/local/images.sh base     the Python base image, from Debian packages (once)
#   deploy/local/images.sh build    the Dockerfile on that base -> $IMAGE_TAG
#   deploy/local/images.sh import   $IMAGE_TAG into the node's containerd (skipped when there)
#   deploy/local/images.sh all      the three; the last line on stdout is the image reference
#   deploy/local/images.sh release COMMIT
#                                   the image of an earlier commit (a release users run), built
#                                   as `all` builds ours from that commit's tree and imported:
#                                   prints "IMAGE TREE", TREE holding that commit's chart
#   deploy/local/images.sh spark    the report image (Dockerfile target `report` on a base with
#                                   Java) with the Spark operator's controller added, imported:
#                                   $SPARK_IMAGE_TAG, for the Spark operator and SparkApplications
#
# Settings (environment):
#   IMAGE_TAG         the image built and imported (localhost/bucketnotify:dev)
#   IMAGE_TARGET      a Dockerfile stage to build (--target); empty: the last stage
#   DOCKERFILE        the Dockerfile ($BN_REPO/Dockerfile)
#   IMAGE_BUILD_ARGS  more `buildah bud` arguments, split on spaces (e.g. "--build-arg EXTRAS=report")
#   BASE_IMAGE        the base image's name, passed as the Dockerfile's PYTHON_IMAGE
#   BASE_MIRROR       the Debian mirror debootstrap uses (the one apt on this host uses)
#   JAVA_BASE_IMAGE   the report image's base: the Python base plus a Java 17 runtime
#   SPARK_IMAGE_TAG   the Spark image (localhost/bucketnotify-spark:dev)
#
# Logs go to stderr; stdout carries only the image reference, for the test fixtures.
SERVICE=images
source "$(dirname "$0")/lib.sh"

IMAGE_TAG=${IMAGE_TAG:-localhost/bucketnotify:dev}
IMAGE_TARGET=${IMAGE_TARGET:-}
DOCKERFILE=${DOCKERFILE:-$BN_REPO/Dockerfile}
IMAGE_BUILD_ARGS=${IMAGE_BUILD_ARGS:-}
BASE_IMAGE=${BASE_IMAGE:-localhost/bucketnotify-base:bookworm}
BASE_SUITE=bookworm
# What python:3.11-slim-bookworm would give the Dockerfile: python (3.11), venv (its ensurepip
# brings the pip the build uses) and the CA certificates. Debian's own pip is not needed, and
# would add 25 MB to every image. Nothing in the Dockerfile depends on Python living in
# /usr/local.
# python3-distutils is named because debootstrap does not resolve the virtual package
# python3.11-venv depends on (python3.11-distutils).
BASE_PACKAGES=(python3.11 python3.11-venv python3-distutils python-is-python3 ca-certificates)
JAVA_BASE_IMAGE=${JAVA_BASE_IMAGE:-localhost/bucketnotify-base-java:bookworm}
# Spark 4 runs on Java 17; its launch scripts call ps, and tini reaps the JVM's children in
# the driver and executor pods as in Spark's own images.
JAVA_PACKAGES=(openjdk-17-jre-headless procps tini)
SPARK_IMAGE_TAG=${SPARK_IMAGE_TAG:-localhost/bucketnotify-spark:dev}
cache="$BN_CACHE/images"
work="$BN_RUN/images"

# The mirror apt uses on this host (lib.sh): debootstrap reaches the same one the same way.
BASE_MIRROR=${BASE_MIRROR:-$(host_mirror)}

# Bump when base() makes a different image from the same packages.
BASE_RECIPE_VERSION=3
recipe() { printf '%s\n' "$BASE_RECIPE_VERSION" "$BASE_SUITE" "$@" | sha256sum | cut -c1-12; }

image_exists() { buildah inspect --type image "$1" >/dev/null 2>&1; }
image_id() { buildah inspect --type image --format '{{.FromImageID}}' "$1"; }
image_size() { buildah images --format '{{.Size}}' "$1" | head -n1; }

# ------------------------------------------------------------------------------------- base

# debootstrap mounts /proc and /sys inside the tree and a failed run leaves them there: never
# let rm descend into the host's.
remove_rootfs() {
  local rootfs=$1 mnt
  [[ -e $rootfs ]] || return 0
  awk '{print $5}' /proc/self/mountinfo | { grep -F "$rootfs/" || true; } | sort -r | while read -r mnt; do
    umount "$mnt" 2>/dev/null || umount -l "$mnt"
  done
  rm -rf --one-file-system "$rootfs"
}

# The root filesystem, cached as a tarball named after its package list: the image can be
# made again from it (after buildah's storage is wiped) without debootstrap's 80 s.
base_rootfs() {
  local tarball rootfs
  tarball="$cache/$BASE_SUITE-minbase-$(recipe "$@").tar"
  if [[ ! -f $tarball ]]; then
    apt_ensure debootstrap debian-archive-keyring
    mkdir -p "$cache"
    rootfs="$cache/rootfs.tmp"
    remove_rootfs "$rootfs"
    log "debootstrap $BASE_SUITE (minbase + $*) from $BASE_MIRROR"
    local packages
    packages=$(IFS=,; echo "$*")
    if ! debootstrap --variant=minbase --include="$packages" "$BASE_SUITE" "$rootfs" "$BASE_MIRROR" \
      >"$cache/debootstrap.log" 2>&1; then
      remove_rootfs "$rootfs"
      die_with_log "debootstrap failed" "$cache/debootstrap.log"
    fi
    # Package lists, caches, manuals, translations and documentation (but the copyright
    # files) are of no use in an image, as in Debian's slim images; /dev is the runtime's.
    rm -rf "${rootfs:?}"/var/lib/apt/lists/* "${rootfs:?}"/var/cache/apt/* \
      "${rootfs:?}"/var/cache/debconf/*-old "${rootfs:?}"/var/log/* "${rootfs:?}"/usr/share/man/* \
      "${rootfs:?}"/usr/share/info/* "${rootfs:?}"/usr/share/locale/* \
      "${rootfs:?}"/dev/* "${rootfs:?}"/run/* "${rootfs:?}"/tmp/*
    find "${rootfs:?}"/usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete
    find "${rootfs:?}"/usr/share/doc -mindepth 1 -type d -empty -delete
    tar --numeric-owner -C "$rootfs" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    remove_rootfs "$rootfs"
  fi
  echo "$tarball"
}

# base IMAGE PACKAGE...: a Debian minbase with those packages as IMAGE (once per package list).
base() {
  local image=$1; shift
  local want
  want=$(recipe "$@")
  if image_exists "$image" && [[ $(buildah inspect --type image \
    --format '{{index .OCIv1.Config.Labels "bucketnotify.base-recipe"}}' "$image") == "$want" ]]; then
    return 0
  fi
  apt_ensure buildah
  local started=$SECONDS tarball ctr mnt
  tarball=$(base_rootfs "$@")
  ctr=$(buildah from scratch)
  buildah add --quiet "$ctr" "$tarball" / >/dev/null
  mnt=$(buildah mount "$ctr")
  # debootstrap copied the host's resolver and name: an image carries neither. The files stay
  # (empty), and so does an empty /etc/xdg/pip, because a build's RUN steps bind-mount over
  # them: a mount point that does not exist would be created and left in the image's layer.
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$mnt/etc/hosts"
  : >"$mnt/etc/resolv.conf"
  : >"$mnt/etc/hostname"
  mkdir -p "$mnt/etc/xdg/pip"
  buildah umount "$ctr" >/dev/null
  buildah config --env LANG=C.UTF-8 \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --label "bucketnotify.base-recipe=$want" --cmd '["python3"]' "$ctr"
  buildah commit --quiet --rm "$ctr" "$image" >/dev/null
  log "base image $image: $(image_size "$image") in $((SECONDS - started)) s"
}

# ------------------------------------------------------------------------------------ build

# pip inside the build reaches the package registries through a TLS-inspecting proxy that
# only the host's CA bundle trusts. The bundle (over the base's own, which OpenSSL-based tools
# read) and a pip.conf naming it (for a pip from PyPI, which reads certifi's) are
# bind-mounted read-only into the RUN steps alone, over paths the base image has: nothing of
# them lands in a layer.
host_ca_bundle() {
  local ca
  ca=$(pip config get global.cert 2>/dev/null || true)
  [[ -n $ca && -f $ca ]] || ca=${PIP_CERT:-}
  [[ -n $ca && -f $ca ]] || ca=/etc/ssl/certs/ca-certificates.crt
  [[ -f $ca ]] || die "no CA bundle found for pip in the build"
  echo "$ca"
}

build() {
  base "$BASE_IMAGE" "${BASE_PACKAGES[@]}"
  local started=$SECONDS ca target=() extra=()
  [[ -f $DOCKERFILE ]] || die "no Dockerfile at $DOCKERFILE"
  if [[ -n $IMAGE_TARGET ]]; then
    grep -qiE "^FROM[[:space:]].*[[:space:]]AS[[:space:]]+${IMAGE_TARGET}[[:space:]]*$" "$DOCKERFILE" ||
      die "$DOCKERFILE has no stage named '$IMAGE_TARGET' (IMAGE_TARGET)"
    target=(--target "$IMAGE_TARGET")
  fi
  [[ -n $IMAGE_BUILD_ARGS ]] && read -r -a extra <<<"$IMAGE_BUILD_ARGS"
  # The OCI labels' version and revision (a tree without .git: IMAGE_REVISION names it).
  extra+=(--build-arg "VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$BN_REPO/pyproject.toml")")
  extra+=(--build-arg "REVISION=${IMAGE_REVISION:-$(git -C "$BN_REPO" rev-parse HEAD 2>/dev/null || echo unknown)}")
  ca=$(host_ca_bundle)
  mkdir -p "$work/pip"
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$work/pip/pip.conf"
  log "building $IMAGE_TAG from $DOCKERFILE${IMAGE_TARGET:+ (target $IMAGE_TARGET)} on $BASE_IMAGE"
  # --layers: a rebuild after a code change reuses the dependencies' layer.
  buildah bud --pull=never --network host --layers --quiet \
    --build-arg "PYTHON_IMAGE=$BASE_IMAGE" "${target[@]}" "${extra[@]}" \
    -v "$ca:/etc/ssl/certs/ca-certificates.crt:ro" -v "$work/pip:/etc/xdg/pip:ro" \
    -t "$IMAGE_TAG" -f "$DOCKERFILE" "$BN_REPO" >"$work/build.log" 2>&1 ||
    die_with_log "buildah bud failed" "$work/build.log"
  log "built $IMAGE_TAG: $(image_size "$IMAGE_TAG"), id $(image_id "$IMAGE_TAG" | cut -c1-12), in $((SECONDS - started)) s"
}

# ----------------------------------------------------------------------------------- import

import() {
  local env_file="$BN_RUN/node/env" sock crictl want have archive started=$SECONDS
  [[ -f $env_file ]] || die "the node is not started: bash deploy/local/node.sh start"
  sock=$(sed -n 's/^NODE_CONTAINERD_SOCKET=//p' "$env_file")
  crictl=$(sed -n 's/^CRICTL=//p' "$env_file")
  image_exists "$IMAGE_TAG" || die "no image $IMAGE_TAG: run $0 build first"
  # The image ID is the digest of its config, the same in buildah and in containerd whatever
  # the archive format: equal IDs, nothing to import.
  want="sha256:$(image_id "$IMAGE_TAG")"
  have=$("$crictl" --runtime-endpoint "unix://$sock" inspecti -o go-template \
    --template '{{.status.id}}' "$IMAGE_TAG" 2>/dev/null || true)
  if [[ $have == "$want" ]]; then
    log "$IMAGE_TAG ${want:7:12} already in the node's containerd"
    return 0
  fi
  mkdir -p "$work"
  archive="$work/import.tar"
  # An OCI archive keeps the config blob, hence the image ID, as buildah has it (a docker
  # archive would convert it); its layers are gzipped whatever the flags (a few seconds).
  buildah push --quiet "$IMAGE_TAG" "oci-archive:$archive:$IMAGE_TAG"
  ctr --address "$sock" --namespace k8s.io images import "$archive" >"$work/import.log" 2>&1 ||
    die_with_log "ctr images import failed" "$work/import.log"
  rm -f "$archive"
  have=$("$crictl" --runtime-endpoint "unix://$sock" inspecti -o go-template \
    --template '{{.status.id}}' "$IMAGE_TAG" 2>/dev/null || true)
  [[ $have == "$want" ]] || die "imported $IMAGE_TAG but the node has ${have:-nothing} instead of $want"
  log "imported $IMAGE_TAG ${want:7:12} into the node's containerd in $((SECONDS - started)) s"
}

# ------------------------------------------------------------------------------------ spark

# The Spark operator's image is the report image with the operator's controller added, as
# upstream builds it on Spark's own image: its controller runs spark-submit. One image serves
# the Spark operator's pods and the SparkApplication's driver and executors, so the node
# imports the nearly 2 GB of Java, Spark and the AWS SDK once.
spark() {
  base "$JAVA_BASE_IMAGE" "${BASE_PACKAGES[@]}" "${JAVA_PACKAGES[@]}"
  local operator report=localhost/bucketnotify-report:dev ctr stamp started
  operator=$(bash "$(dirname "$0")/spark-operator-build.sh" | tail -n1)/spark-operator
  IMAGE_TAG=$report IMAGE_TARGET=report BASE_IMAGE=$BASE_IMAGE \
    IMAGE_BUILD_ARGS="--build-arg EXTRAS=report --build-arg REPORT_BASE_IMAGE=$JAVA_BASE_IMAGE" build
  # Committed again only when the report image or the binary changed: an unchanged image ID
  # spares the import.
  stamp="$(image_id "$report" | cut -c1-12)-$(sha256sum "$operator" | cut -c1-12)"
  if ! image_exists "$SPARK_IMAGE_TAG" || [[ $(buildah inspect --type image \
    --format '{{index .OCIv1.Config.Labels "bucketnotify.spark-stamp"}}' "$SPARK_IMAGE_TAG") != "$stamp" ]]; then
    started=$SECONDS
    ctr=$(buildah from --pull=never "$report")
    buildah copy --quiet --chmod 0755 "$ctr" "$operator" /usr/bin/spark-operator >/dev/null
    buildah config --label "bucketnotify.spark-stamp=$stamp" "$ctr"
    buildah commit --quiet --rm "$ctr" "$SPARK_IMAGE_TAG" >/dev/null
    log "built $SPARK_IMAGE_TAG: $(image_size "$SPARK_IMAGE_TAG") in $((SECONDS - started)) s"
  fi
  IMAGE_TAG=$SPARK_IMAGE_TAG import
  IMAGE_TAG=$SPARK_IMAGE_TAG
}

# ---------------------------------------------------------------------------------- release

# The commit's own Dockerfile and tree, as its release was built: an upgrade test installs
# that chart and image first. A clone without the commit (shallow) fetches it from origin.
release() {
  local commit=${1:-} short revision
  [[ -n $commit ]] || die "usage: $0 release COMMIT"
  if ! git -C "$BN_REPO" cat-file -e "$commit^{commit}" 2>/dev/null; then
    git -C "$BN_REPO" fetch --quiet origin "$commit" 2>/dev/null ||
      die "commit $commit is not in $BN_REPO and origin does not give it (a shallow clone? git fetch --unshallow)"
  fi
  short=$(git -C "$BN_REPO" rev-parse --short=12 "$commit^{commit}")
  tree="$work/release-$short"
  if [[ ! -f $tree/.complete ]]; then
    rm -rf "$tree" && mkdir -p "$tree"
    git -C "$BN_REPO" archive "$short" | tar -x -C "$tree"
    touch "$tree/.complete"
  fi
  base "$BASE_IMAGE" "${BASE_PACKAGES[@]}"
  revision=$(git -C "$BN_REPO" rev-parse "$short")
  IMAGE_TAG="localhost/bucketnotify:$short" DOCKERFILE="$tree/Dockerfile" BN_REPO="$tree" \
    IMAGE_REVISION="$revision" build
  IMAGE_TAG="localhost/bucketnotify:$short" import
  IMAGE_TAG="localhost/bucketnotify:$short $tree"
}

case "${1:-}" in
  base) base "$BASE_IMAGE" "${BASE_PACKAGES[@]}" ;;
  build) build ;;
  import) import ;;
  all) base "$BASE_IMAGE" "${BASE_PACKAGES[@]}"; build; import ;;
  spark) spark ;;
  release) release "${2:-}" ;;
  *) die "usage: $0 base|build|import|all|spark|release COMMIT" ;;
esac
echo "$IMAGE_TAG"
