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
ENV EVENTLOG_DATA_DIR=/data EVENTLOG_HOST=0.0.0.0 EVENTLOG_PORT=8080
VOLUME ["/data"]
EXPOSE 8080
STOPSIGNAL SIGTERM
CMD ["eventlog", "serve"]
