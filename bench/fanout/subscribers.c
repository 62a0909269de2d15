/* Many subscribers of one stream, for the fan-out benchmark (bench/http_fanout.py).
 *
 *   subscribers sse   HOST PORT PATH    CONNECTIONS
 *   subscribers redis HOST PORT CHANNEL CONNECTIONS
 *
 * Opens CONNECTIONS connections (an SSE GET, or a Redis SUBSCRIBE), prints "ready" once every
 * one has its first answer bytes, then reads until a line arrives on stdin. Each message the
 * producer sends carries "T=<send time, CLOCK_REALTIME ns>;S=<sequence>;" in its payload:
 * the delivery latency of every copy is now - T, and each connection must see the sequences
 * consecutively (each message exactly once, in order). Prints one JSON object at the end.
 * A C client because a Python one would need more CPU than the servers it measures.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CARRY 64

typedef struct {
    int fd;
    int started;          /* got answer bytes */
    long long last_seq;   /* -1: none yet */
    long long first_seq;
    long long events;
    size_t carry_len;
    char carry[CARRY];
} conn_t;

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

static long long *lat = NULL;
static size_t lat_n = 0, lat_cap = 0;
static long long gaps = 0, repeats = 0, bad = 0;

static void record(conn_t *c, long long t, long long seq, long long now) {
    if (lat_n == lat_cap) {
        lat_cap = lat_cap ? lat_cap * 2 : 1 << 20;
        lat = realloc(lat, lat_cap * sizeof *lat);
        if (!lat) { perror("realloc"); exit(2); }
    }
    lat[lat_n++] = now - t;
    if (c->last_seq < 0) c->first_seq = seq;
    else if (seq <= c->last_seq) repeats++;
    else if (seq != c->last_seq + 1) gaps += seq - c->last_seq - 1;
    if (seq > c->last_seq) c->last_seq = seq;
    c->events++;
}

/* scan buf for complete "T=<digits>;S=<digits>;" markers; keep an unfinished tail */
static void scan(conn_t *c, const char *data, size_t n, long long now) {
    static char buf[65536 + CARRY];
    size_t len = c->carry_len;
    memcpy(buf, c->carry, len);
    memcpy(buf + len, data, n);
    len += n;
    size_t i = 0, keep_from = len > CARRY ? len - CARRY : 0;
    while (i + 1 < len) {
        char *p = memmem(buf + i, len - i, "T=", 2);
        if (!p) break;
        size_t at = p - buf;
        char *q = p + 2;
        char *end = buf + len;
        long long t = 0, s = 0;
        while (q < end && *q >= '0' && *q <= '9') t = t * 10 + (*q++ - '0');
        if (q + 3 > end) { keep_from = at; goto done; }
        if (*q != ';' || q[1] != 'S' || q[2] != '=') { bad++; i = at + 2; continue; }
        q += 3;
        while (q < end && *q >= '0' && *q <= '9') s = s * 10 + (*q++ - '0');
        if (q >= end) { keep_from = at; goto done; }
        if (*q != ';') { bad++; i = at + 2; continue; }
        record(c, t, s, now);
        i = (q - buf) + 1;
        keep_from = i > keep_from ? i : keep_from;
        if (len - keep_from > CARRY) keep_from = len - CARRY;
    }
    if (i > keep_from) keep_from = i;
done:
    c->carry_len = len - keep_from;
    if (c->carry_len > CARRY) { keep_from = len - CARRY; c->carry_len = CARRY; }
    memmove(c->carry, buf + keep_from, c->carry_len);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s sse|redis HOST PORT PATH|CHANNEL CONNECTIONS\n", argv[0]);
        return 2;
    }
    int sse = strcmp(argv[1], "sse") == 0;
    const char *host = argv[2];
    int port = atoi(argv[3]);
    const char *what = argv[4];
    int n = atoi(argv[5]);
    char request[1024];
    int rlen = sse ? snprintf(request, sizeof request,
                              "GET %s HTTP/1.1\r\nHost: %s:%d\r\nAccept: text/event-stream\r\n\r\n", what, host, port)
                   : snprintf(request, sizeof request, "SUBSCRIBE %s\r\n", what);
    conn_t *conns = calloc(n, sizeof *conns);
    int ep = epoll_create1(0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, host, &addr.sin_addr);
    for (int i = 0; i < n; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) { perror("socket"); return 2; }
        if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) { perror("connect"); return 2; }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (write(fd, request, rlen) != rlen) { perror("write"); return 2; }
        fcntl(fd, F_SETFL, O_NONBLOCK);
        conns[i].fd = fd;
        conns[i].last_seq = -1;
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
    struct epoll_event sev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
    epoll_ctl(ep, EPOLL_CTL_ADD, 0, &sev);
    int started = 0, ready_said = 0, closed = 0;
    static char rbuf[65536];
    struct epoll_event events[256];
    for (;;) {
        int k = epoll_wait(ep, events, 256, 1000);
        if (k < 0 && errno == EINTR) continue;
        long long now = now_ns();
        int stop = 0;
        for (int e = 0; e < k; e++) {
            uint32_t i = events[e].data.u32;
            if (i == UINT32_MAX) { stop = 1; continue; }
            conn_t *c = &conns[i];
            for (;;) {
                ssize_t got = read(c->fd, rbuf, sizeof rbuf);
                if (got > 0) {
                    if (!c->started) { c->started = 1; started++; }
                    scan(c, rbuf, (size_t)got, now);
                    continue;
                }
                if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
                    fprintf(stderr, "connection %u closed after %lld events: %s\n", i, c->events, got == 0 ? "EOF" : strerror(errno));
                    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                    close(c->fd);
                    c->fd = -1;
                    closed++;
                }
                break;
            }
        }
        if (!ready_said && started == n) {
            printf("ready\n");
            fflush(stdout);
            ready_said = 1;
        }
        if (stop) break;
    }
    qsort(lat, lat_n, sizeof *lat, cmp_ll);
    long long min_events = -1, max_events = 0;
    for (int i = 0; i < n; i++) {
        if (min_events < 0 || conns[i].events < min_events) min_events = conns[i].events;
        if (conns[i].events > max_events) max_events = conns[i].events;
    }
#define P(q) (lat_n ? lat[(size_t)((lat_n - 1) * (q))] / 1000 : -1)
    printf("{\"connections\": %d, \"started\": %d, \"closed\": %d, \"deliveries\": %zu, "
           "\"min_per_connection\": %lld, \"max_per_connection\": %lld, \"gaps\": %lld, \"repeats\": %lld, "
           "\"unparsed\": %lld, \"p50_us\": %lld, \"p90_us\": %lld, \"p99_us\": %lld, \"p999_us\": %lld, \"max_us\": %lld}\n",
           n, started, closed, lat_n, min_events, max_events, gaps, repeats, bad, P(0.5), P(0.9), P(0.99), P(0.999),
           lat_n ? lat[lat_n - 1] / 1000 : -1);
    return 0;
}
