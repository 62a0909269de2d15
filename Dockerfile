# eventlog service image. Build: docker build -t eventlog .
FROM python:3.11-slim-bookworm
WORKDIR /srv/eventlog
COPY pyproject.toml README.md ./
COPY app ./app
COPY engine ./engine
COPY api ./api
COPY workers ./workers
COPY analytics ./analytics
RUN pip install --no-cache-dir .
# the volume holds the data dir and, beside it, the snapshots (data.snapshots: hard links of
# its segments, so on its filesystem, and outside the log dir, which Kafka requires)
ENV EVENTLOG_DATA_DIR=/var/lib/eventlog/data EVENTLOG_HOST=0.0.0.0 EVENTLOG_PORT=8080
VOLUME ["/var/lib/eventlog"]
EXPOSE 8080
STOPSIGNAL SIGTERM
CMD ["eventlog", "serve"]
