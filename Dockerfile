# lockd server image: a static binary on distroless, as a non-root user.
#
#   make image        # docker build with the version stamped (lockd --version)
#   printf 'billing:%s\n' "$(openssl rand -hex 32)" > auth
#   openssl rand -hex 32 > admin-token
#   chmod 600 auth admin-token && sudo chown 65532 auth admin-token
#   docker run --rm -p 7420:7420 -p 7421:7421 \
#     -v "$PWD/auth:/etc/lockd/auth:ro" -v "$PWD/admin-token:/etc/lockd/admin-token:ro" \
#     -v lockd-data:/var/lib/lockd lockd
#
# Inside a container the server must listen on 0.0.0.0 to be reachable,
# and lockd refuses a non-loopback address without authentication, so the
# image turns authentication on: mount an auth file (tenant:hex-secret
# lines) at /etc/lockd/auth. It must be readable by uid 65532 and by
# nobody else (mode 0600 or 0400: lockd refuses a file the group or others
# can read). Without one the container exits 1 saying so. The admin port
# listens on every interface too, which lockd allows only with a bearer
# token: mount one (a line of at least 16 characters, same ownership and
# mode) at /etc/lockd/admin-token. /healthz and /metrics answer without
# it; lock inspection and membership changes need it (lockctl
# --admin-token-file). Client certificates can stand in for the token:
# mount the admin endpoint's certificate, key and client CA, and give
# -e LOCKD_ADMIN_TLS_CERT=... -e LOCKD_ADMIN_TLS_KEY=...
# -e LOCKD_ADMIN_TLS_CLIENT_CA=... -e LOCKD_ADMIN_TOKEN_FILE= (lockctl
# --admin-ca, --admin-cert, --admin-key). For a throwaway trusted network only:
# -e LOCKD_AUTH_FILE= -e LOCKD_INSECURE_NO_AUTH=true
# -e LOCKD_ADMIN_TOKEN_FILE= -e LOCKD_INSECURE_ADMIN=true.

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The context has no .git, so the version comes from the build: make image,
# or docker build --build-arg VERSION=$(git describe --tags --always)
# --build-arg REVISION=$(git rev-parse HEAD).
ARG VERSION
ARG REVISION
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false \
    -ldflags "-X github.com/lockd/lockd/cmd/internal/version.version=${VERSION} -X github.com/lockd/lockd/cmd/internal/version.revision=${REVISION}" \
    -o /out/lockd ./cmd/lockd
# The data directory, created here because the final image has no shell.
RUN mkdir /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/lockd /usr/local/bin/lockd
COPY --from=build --chown=65532:65532 /out/data /var/lib/lockd
USER 65532:65532
ENV LOCKD_LISTEN=0.0.0.0:7420 \
    LOCKD_ADMIN=0.0.0.0:7421 \
    LOCKD_ADMIN_TOKEN_FILE=/etc/lockd/admin-token \
    LOCKD_AUTH_FILE=/etc/lockd/auth \
    LOCKD_DATA_DIR=/var/lib/lockd
VOLUME /var/lib/lockd
EXPOSE 7420 7421
ENTRYPOINT ["/usr/local/bin/lockd"]
CMD ["serve"]
