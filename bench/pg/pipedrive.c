/* pipedrive: the PostgreSQL store's shape of work, driven through libpq
 * pipeline mode as src/store_pg_link.c does it, to compare with pgbench
 * (bench/pg/ceiling builds and runs it).
 *
 *   pipedrive CONNINFO ACQUIRE.sql COMPLETE.sql CONNS K MODE SECONDS
 *
 * CONNS connections, one thread each. Each round a connection takes K new
 * keys: it sends K ACQUIREs, reads their answers, then K COMPLETEs of the
 * same keys, and reads those (a lane with K operations queued). MODE:
 *   each     every statement followed by its own Sync (today's store:
 *            K implicit transactions, K commits, pipelined)
 *   implicit K statements then one Sync (one implicit transaction: one commit)
 *   tx       BEGIN, K statements, COMMIT, one Sync (one explicit transaction)
 * Prints: keys, seconds, keys/s, errors. The statement text is the .sql
 * files' as they are (prepared, parameters in text format as $1..$n). */
#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *conninfo, *mode;
static char *acq_sql, *cmp_sql;
static int K, secs;
static double t_end;
static char fp_hex[2 + 64 + 1], head_hex[2 + 600 + 1], body_hex[2 + 200 + 1];

struct res { long keys, errors; };

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) { perror(path); exit(2); }
    char *buf = calloc(1, 1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static void hexfill(char *dst, int nbytes, unsigned seed)
{
    dst[0] = '\\'; dst[1] = 'x';
    for (int i = 0; i < nbytes; i++)
        sprintf(dst + 2 + 2 * i, "%02x", (unsigned)((i * 37 + seed) & 0xff));
}

static void die(PGconn *c, const char *what)
{
    fprintf(stderr, "pipedrive: %s: %s\n", what, PQerrorMessage(c));
    exit(1);
}

/* Reads results until <syncs> PGRES_PIPELINE_SYNC have come; counts errors. */
static long drain(PGconn *c, int syncs)
{
    long errors = 0;
    while (syncs > 0) {
        PGresult *r = PQgetResult(c);
        if (!r) continue; /* the end of one statement's results */
        ExecStatusType st = PQresultStatus(r);
        if (st == PGRES_PIPELINE_SYNC) syncs--;
        else if (st == PGRES_FATAL_ERROR || st == PGRES_PIPELINE_ABORTED) {
            if (errors++ == 0 && st == PGRES_FATAL_ERROR)
                fprintf(stderr, "pipedrive: %s", PQresultErrorMessage(r));
        }
        PQclear(r);
    }
    return errors;
}

static void send_plain(PGconn *c, const char *sql)
{
    if (!PQsendQueryParams(c, sql, 0, NULL, NULL, NULL, NULL, 0)) die(c, sql);
}

static void *lane(void *arg)
{
    struct res *out = arg;
    PGconn *c = PQconnectdb(conninfo);
    if (PQstatus(c) != CONNECTION_OK) die(c, "connect");
    PGresult *r = PQprepare(c, "acquire", acq_sql, 0, NULL);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) die(c, "prepare acquire");
    PQclear(r);
    r = PQprepare(c, "complete", cmp_sql, 0, NULL);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) die(c, "prepare complete");
    PQclear(r);
    if (!PQenterPipelineMode(c)) die(c, "pipeline");
    int each = !strcmp(mode, "each"), tx = !strcmp(mode, "tx");
    char (*keys)[64] = calloc(K, 64);
    unsigned long seq = 0, salt = ((unsigned long)getpid() << 20) ^ (unsigned long)(size_t)arg ^
                                  (unsigned long)(now() * 1e6);
    const char *tok = "0123456789abcdef0123456789abcdef";
    while (now() < t_end) {
        for (int i = 0; i < K; i++)
            snprintf(keys[i], 64, "bench:default:%lx-%lu", salt, seq++);
        for (int phase = 0; phase < 2; phase++) {
            if (tx) send_plain(c, "BEGIN");
            for (int i = 0; i < K; i++) {
                int ok;
                if (phase == 0) {
                    const char *v[7] = {keys[i], fp_hex, tok, "30000", "86400000", "f", ""};
                    ok = PQsendQueryPrepared(c, "acquire", 7, v, NULL, NULL, 0);
                } else {
                    const char *v[6] = {keys[i], tok, head_hex, body_hex, "86400000", ""};
                    ok = PQsendQueryPrepared(c, "complete", 6, v, NULL, NULL, 0);
                }
                if (!ok) die(c, "send");
                if (each && !PQpipelineSync(c)) die(c, "sync");
            }
            if (tx) send_plain(c, "COMMIT");
            if (!each && !PQpipelineSync(c)) die(c, "sync");
            out->errors += drain(c, each ? K : 1);
        }
        out->keys += K;
    }
    PQfinish(c);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 8) {
        fprintf(stderr, "usage: pipedrive CONNINFO ACQUIRE.sql COMPLETE.sql CONNS K MODE SECONDS\n");
        return 2;
    }
    conninfo = argv[1];
    acq_sql = slurp(argv[2]);
    cmp_sql = slurp(argv[3]);
    int conns = atoi(argv[4]);
    K = atoi(argv[5]);
    mode = argv[6];
    secs = atoi(argv[7]);
    if (strcmp(mode, "each") && strcmp(mode, "implicit") && strcmp(mode, "tx")) return 2;
    hexfill(fp_hex, 32, 1);
    hexfill(head_hex, 300, 2);
    hexfill(body_hex, 100, 3);
    pthread_t th[256];
    struct res res[256];
    memset(res, 0, sizeof res);
    double t0 = now();
    t_end = t0 + secs;
    for (int i = 0; i < conns; i++) pthread_create(&th[i], NULL, lane, &res[i]);
    long keys = 0, errors = 0;
    for (int i = 0; i < conns; i++) {
        pthread_join(th[i], NULL);
        keys += res[i].keys;
        errors += res[i].errors;
    }
    double dt = now() - t0;
    printf("keys=%ld seconds=%.2f keys_per_s=%.0f errors=%ld\n", keys, dt, keys / dt, errors);
    return errors ? 1 : 0;
}
