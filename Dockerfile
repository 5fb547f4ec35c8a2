# fleetwatch: a static binary on a distroless base, run as a non-root user.
#   docker build -t fleetwatch .
#   docker run --rm -p 127.0.0.1:8080:8080 fleetwatch
# The default command serves HTTP without authentication (--http-insecure),
# for a port published on the host's loopback only; see docs/DEPLOY.md
# "Security" to protect it.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags="-s -w" -o /out/fleetwatch ./cmd/fleetwatch \
 && mkdir -p /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/fleetwatch /usr/local/bin/fleetwatch
# The data directory (embedded NATS store, drift reviews) belongs to the
# distroless "nonroot" user (65532), so a named volume mounted there is
# writable.
COPY --from=build --chown=65532:65532 /out/data /var/lib/fleetwatch
USER 65532:65532
WORKDIR /var/lib/fleetwatch
EXPOSE 8080 4222
ENTRYPOINT ["/usr/local/bin/fleetwatch"]
CMD ["serve", "--http", "0.0.0.0:8080", "--http-insecure"]
