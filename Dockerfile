# ironlb's image for people with Docker: one static binary, both halves (`ironlb controller`,
# `ironlb speaker`). It describes the image `make image` assembles without Docker
# (hack/image, the one the release publishes): the same files (/ironlb, /etc/passwd,
# /etc/group, /tmp), user, entrypoint, PATH and labels; hack/image/dockerfile_test.go keeps the
# two together. Build it with the values make uses (docs/install.md):
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION=$(make -s version) --build-arg COMMIT=$(git rev-parse HEAD) \
#     --build-arg BUILD_DATE=$(date -u -d @$(git log -1 --format=%ct) +%Y-%m-%dT%H:%M:%SZ) \
#     -t ghcr.io/ironlb/ironlb:$(make -s version) .
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS TARGETARCH VERSION=dev COMMIT=unknown BUILD_DATE=1970-01-01T00:00:00Z
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY internal/ internal/
COPY speaker/ speaker/
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -buildvcs=false \
    -ldflags "-s -w -X main.version=$VERSION -X main.commit=$COMMIT -X main.date=$BUILD_DATE" \
    -o /rootfs/ironlb ./cmd/ironlb
COPY hack/image/rootfs/etc/ /rootfs/etc/
RUN mkdir -m 1777 /rootfs/tmp && chmod 0755 /rootfs/etc && chmod 0644 /rootfs/etc/passwd /rootfs/etc/group

# No base image: nothing but the files above (no shell, no CA certificates: ironlb only
# talks to the API server, with the service account's CA).
FROM scratch
COPY --from=build /rootfs/ /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /
# The controller runs as this user; the speaker's pod overrides it with root so that its
# only capability, NET_RAW, is effective.
USER 65532:65532
ENTRYPOINT ["/ironlb"]
ARG VERSION=dev COMMIT=unknown BUILD_DATE=1970-01-01T00:00:00Z
LABEL org.opencontainers.image.title="ironlb" \
      org.opencontainers.image.description="MetalLB-compatible Layer-2 LoadBalancer for bare-metal Kubernetes" \
      org.opencontainers.image.source="https://github.com/ironlb/ironlb" \
      org.opencontainers.image.revision="$COMMIT" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.created="$BUILD_DATE"
