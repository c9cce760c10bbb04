# One static binary, both halves (`ironlb controller`, `ironlb speaker`), on a distroless base.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY internal/ internal/
COPY speaker/ speaker/
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/ironlb ./cmd/ironlb

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/ironlb /ironlb
# The controller runs as this user; the speaker's pod overrides it with root so that its
# only capability, NET_RAW, is effective.
USER 65532:65532
ENTRYPOINT ["/ironlb"]
