#!/usr/bin/env bash
# release.sh publishes release vX.Y.Z of the current commit: the multi-arch image and the Helm
# chart (an OCI artifact) to the registry, both signed with cosign (keyless: the CI job's OIDC
# identity), and a GitHub release with the plain manifests, the CRDs, the chart and checksums.
# The version lives in charts/ironlb/Chart.yaml (version = appVersion = the tag without "v").
#
# The release workflow (.github/workflows/release.yaml) runs it on a tag, after logging in to
# the registry (docker login; the image tool and helm both read Docker's credentials).
#
#   hack/release.sh vX.Y.Z             publish (needs the network, cosign, gh)
#   hack/release.sh --dry-run vX.Y.Z   every step that needs no network, run by make test:
#                                      builds and checks everything, pushes the image and the
#                                      chart to an in-memory registry on 127.0.0.1 and reads
#                                      them back, prints the cosign and gh commands.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
if [ "${1:-}" = "--dry-run" ]; then DRY_RUN=1; shift; fi
[ $# -eq 1 ] || { echo "usage: hack/release.sh [--dry-run] vX.Y.Z" >&2; exit 2; }
TAG=$1
REGISTRY=${RELEASE_REGISTRY:-ghcr.io/ironlb}
IMAGE_TOOL=bin/ironlb-image
HELM=bin/helm
step() { echo ">> $*"; }
# publish runs a command that needs the network and credentials; the dry run prints it.
publish() {
	if [ "$DRY_RUN" = 1 ]; then echo "   (dry run) would run: $*"; else "$@"; fi
}

step "building and checking the release files (make release-artifacts TAG=$TAG)"
make --no-print-directory release-artifacts TAG="$TAG"
VERSION=$(make --no-print-directory -s version)
FILES=(bin/release/ironlb.yaml bin/release/ironlb-crds.yaml "bin/release/ironlb-$VERSION.tgz" bin/release/image-digest bin/release/SHA256SUMS)
(cd bin/release && sha256sum --check --quiet SHA256SUMS)

PLAIN_HTTP=()
if [ "$DRY_RUN" = 1 ]; then
	tmp=$(mktemp -d)
	"$IMAGE_TOOL" registry --listen 127.0.0.1:0 --addr-file "$tmp/addr" >/dev/null &
	registry_pid=$!
	trap 'kill "$registry_pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
	for _ in $(seq 100); do [ -s "$tmp/addr" ] && break; sleep 0.1; done
	[ -s "$tmp/addr" ] || { echo "the dry-run registry did not start" >&2; exit 1; }
	REGISTRY="$(cat "$tmp/addr")/ironlb"
	PLAIN_HTTP=(--plain-http)
	step "dry run: pushing to the in-memory registry $REGISTRY instead of ${RELEASE_REGISTRY:-ghcr.io/ironlb}"
fi

step "pushing the image $REGISTRY/ironlb:$VERSION (linux/amd64, linux/arm64)"
"$IMAGE_TOOL" push --layout bin/image/oci --ref "$REGISTRY/ironlb:$VERSION" --digest-file bin/release/image-pushed-digest
IMAGE_DIGEST=$(cat bin/release/image-pushed-digest)
[ "$IMAGE_DIGEST" = "$(cat bin/image/digest)" ] ||
	{ echo "the registry got $IMAGE_DIGEST, make image built $(cat bin/image/digest)" >&2; exit 1; }

step "signing the image (cosign keyless; --recursive signs each platform's image too)"
publish cosign sign --yes --recursive "$REGISTRY/ironlb@$IMAGE_DIGEST"

step "pushing the chart oci://$REGISTRY/charts/ironlb:$VERSION"
out=$("$HELM" push "bin/release/ironlb-$VERSION.tgz" "oci://$REGISTRY/charts" "${PLAIN_HTTP[@]}" 2>&1) || { echo "$out" >&2; exit 1; }
echo "$out"
CHART_DIGEST=$(echo "$out" | awk '/^Digest:/ {print $2}')
[ -n "$CHART_DIGEST" ] || { echo "helm push printed no digest" >&2; exit 1; }
app=$("$HELM" show chart "oci://$REGISTRY/charts/ironlb" --version "$VERSION" "${PLAIN_HTTP[@]}" 2>/dev/null | awk '/^appVersion:/ {gsub(/"/, "", $2); print $2}')
[ "$app" = "$VERSION" ] || { echo "the pushed chart has appVersion '$app', want $VERSION" >&2; exit 1; }

step "signing the chart"
publish cosign sign --yes "$REGISTRY/charts/ironlb@$CHART_DIGEST"

step "creating the GitHub release $TAG with ${FILES[*]}"
publish gh release create "$TAG" --verify-tag --title "$TAG" --generate-notes "${FILES[@]}"

step "done: $REGISTRY/ironlb:$VERSION@$IMAGE_DIGEST, oci://$REGISTRY/charts/ironlb:$VERSION@$CHART_DIGEST"
