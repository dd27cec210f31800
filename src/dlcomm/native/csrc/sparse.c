/* Sparse streaming aggregation in the switch, rule for rule the Python specification:
 * dlcomm/switch/sparse_rounds.py (check and add a contribution, finish a round),
 * dlcomm/switch/planning.py (plan the next round from the look-ahead) and the payload of
 * dlcomm/wire/sparse.py. The caller (dataplane.c) holds the slot's mutex. */
#include <stdlib.h>
#include <string.h>

#include "dlc.h"

static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static uint64_t words_of(uint64_t m) { return (m + 31) / 32; }

int dlc_valid_exponent(int e) {
    return (e >= -148 && e <= 128) || e == EXP_ZERO || e == EXP_NONFINITE;
}

/* The bits of a group's last mask word that lie beyond its m blocks. */
static uint32_t beyond(uint64_t m) { return m % 32 ? ~((1u << (m % 32)) - 1) : 0; }

/* -- memory ----------------------------------------------------------------------------- */
static int plan_reserve(dlc_plan *p, int g, int words) {
    if (g <= p->cap) return 0;
    int64_t *groups = realloc(p->groups, (size_t)g * sizeof *groups);
    if (groups) p->groups = groups;
    int32_t *exps = realloc(p->exps, (size_t)g * sizeof *exps);
    if (exps) p->exps = exps;
    uint32_t *unions = realloc(p->unions, (size_t)g * (size_t)words * 4 + 4);
    if (unions) p->unions = unions;
    if (!groups || !exps || !unions) return -2;
    p->cap = g;
    return 0;
}

static void plan_free(dlc_plan *p) { free(p->groups); free(p->exps); free(p->unions); }

static void plan_copy(dlc_plan *dst, const dlc_plan *src, int words) {
    dst->g = src->g; dst->run = src->run;
    memcpy(dst->groups, src->groups, (size_t)src->g * sizeof *dst->groups);
    memcpy(dst->exps, src->exps, (size_t)src->g * sizeof *dst->exps);
    memcpy(dst->unions, src->unions, (size_t)src->g * (size_t)words * 4);
}

int dlc_sparse_alloc(dlc_job *job) {
    int w = job->workers;
    for (int s = 0; s < job->slot_count; s++) {
        dlc_stream *st = calloc(1, sizeof *st);
        job->slots[s].stream = st;
        if (!st) return -2;
        st->pending_seq = -1;
        st->nlook = calloc((size_t)w, sizeof *st->nlook);
        st->caplook = calloc((size_t)w, sizeof *st->caplook);
        st->look = calloc((size_t)w, sizeof *st->look);
        if (!st->nlook || !st->caplook || !st->look) return -2;
        for (int i = 0; i < 2; i++) {
            dlc_sparse_copy *sp = calloc(1, sizeof *sp);
            job->slots[s].c[i].sp = sp;
            if (!sp) return -2;
            sp->base = calloc((size_t)job->m + 1, sizeof *sp->base);
            if (!sp->base) return -2;
        }
    }
    return 0;
}

void dlc_sparse_free(dlc_job *job) {
    if (!job->slots) return;
    for (int s = 0; s < job->slot_count; s++) {
        dlc_stream *st = job->slots[s].stream;
        if (st) {
            for (int r = 0; st->look && r < job->workers; r++) free(st->look[r]);
            free(st->look); free(st->nlook); free(st->caplook);
            plan_free(&st->pending);
            free(st);
            job->slots[s].stream = NULL;
        }
        for (int i = 0; i < 2; i++) {
            dlc_sparse_copy *sp = job->slots[s].c[i].sp;
            if (!sp) continue;
            plan_free(&sp->round);
            free(sp->base); free(sp->frame); free(sp->cipher); free(sp);
            job->slots[s].c[i].sp = NULL;
        }
    }
}

/* -- starting a round (switch/dataplane.Dataplane._start_round, sparse part) ------------ */
/* 0 if the round cannot start here: a planned round this slot did not plan. */
int dlc_sparse_start(dlc_job *job, dlc_slot *s, dlc_copy *c, const dlc_hdr *h) {
    dlc_stream *st = s->stream;
    dlc_sparse_copy *sp = c->sp;
    int words = (int)words_of((uint64_t)job->m);
    if (h->flags & F_ANNOUNCE) {   /* everyone says where its data is: a fresh stream */
        sp->announce = 1; sp->round.g = 0; sp->nblocks = 0;
        for (int r = 0; r < job->workers; r++) st->nlook[r] = 0;
        st->pending_seq = -1; st->pending.g = 0;
        return 1;
    }
    if (st->pending_seq != (int64_t)h->seq) return 0;
    if (plan_reserve(&sp->round, st->pending.g, words)) return -2;
    plan_copy(&sp->round, &st->pending, words);
    sp->announce = 0;
    int n = 0;   /* each group's first row of sums: the planned blocks in row-major order */
    for (int i = 0; i < sp->round.g; i++) {
        sp->base[i] = n;
        for (int w = 0; w < words; w++)
            n += __builtin_popcount(sp->round.unions[(size_t)i * words + w]);
    }
    sp->nblocks = n;   /* at most m (a plan's capacity): the sums fit the accumulator */
    memset(c->frame + DLC_HDR, 0, 4u * (size_t)n * (size_t)job->block);
    return 1;
}

/* -- a contribution (sparse_rounds.add_sparse) ------------------------------------------ */
/* wire/sparse.decode: 0 if the payload is consistent, -1 if not. */
int dlc_sparse_decode(const uint8_t *p, size_t len, uint32_t numel, int b, int width,
                      dlc_sparse_view *v) {
    if (len < 12) return -1;
    v->nseg = rd32(p); v->nhead = rd32(p + 4); v->m = rd32(p + 8);
    v->words = words_of(v->m);
    uint64_t offset = 12 + 4ull * (uint64_t)width * v->nhead;
    uint64_t end = offset + 4ull * v->nseg * (1 + v->words);
    if (end > len || (v->nseg && !v->m)) return -1;
    v->head = p + 12; v->groups = p + offset; v->masks = p + offset + 4ull * v->nseg;
    for (uint32_t i = 1; i < v->nseg; i++)
        if (rd32(v->groups + 4ull * i) <= rd32(v->groups + 4ull * (i - 1))) return -1;
    uint64_t present = 0;
    uint32_t stray = beyond(v->m);
    for (uint64_t i = 0; i < v->nseg; i++) {
        const uint8_t *row = v->masks + 4 * i * v->words;
        for (uint64_t w = 0; w < v->words; w++) present += (uint64_t)__builtin_popcount(rd32(row + 4 * w));
        if (rd32(row + 4 * (v->words - 1)) & stray) return -1;
    }
    if (present * (uint64_t)b != numel || len - end != 4ull * numel) return -1;
    v->values = p + end;
    return 0;
}

/* The union's bit (group row i, block j): its row of sums, or -1 if not planned. */
static int row_of(const dlc_sparse_copy *sp, int words, int i, int j) {
    const uint32_t *u = sp->round.unions + (size_t)i * words;
    if (!(u[j / 32] >> (j % 32) & 1)) return -1;
    int n = sp->base[i];
    for (int w = 0; w < j / 32; w++) n += __builtin_popcount(u[w]);
    return n + __builtin_popcount(u[j / 32] & ((1u << (j % 32)) - 1));
}

static int reserve_look(dlc_stream *st, int rank, uint32_t rows, int width) {
    if ((int64_t)rows <= st->caplook[rank]) return 0;
    uint32_t *look = realloc(st->look[rank], (size_t)rows * (size_t)width * 4);
    if (!look) return -2;
    st->look[rank] = look; st->caplook[rank] = (int)rows;
    return 0;
}

int dlc_sparse_add(dlc_job *job, dlc_slot *s, dlc_copy *c, const dlc_hdr *h,
                   const uint8_t *payload, size_t len) {
    int m = job->m, b = job->block, words = (int)words_of((uint64_t)m), width = 2 + words;
    dlc_sparse_copy *sp = c->sp;
    dlc_sparse_view v;
    if (dlc_sparse_decode(payload, len, h->numel, b, width, &v)) return C_drop_length;
    uint32_t stray = beyond((uint64_t)m);
    for (uint32_t r = 0; r < v.nhead; r++)   /* the look-ahead's masks: no bit beyond m */
        if (rd32(v.head + 4ull * ((uint64_t)r * width + width - 1)) & stray) return C_drop_length;
    for (uint32_t r = 0; r < v.nhead; r++)
        if (!dlc_valid_exponent((int32_t)rd32(v.head + 4ull * ((uint64_t)r * width + 1))))
            return C_drop_bad_exponent;
    for (uint32_t i = 0; i < h->numel; i++) {
        int32_t x = (int32_t)rd32(v.values + 4ull * i);
        if (x > job->limit || x < -job->limit) return C_drop_bad_value;
    }
    dlc_stream *st = s->stream;
    if (sp->announce) {
        if (v.nseg) return C_drop_unplanned;   /* values in an announce round */
    } else if (v.nseg) {
        if (v.m != (uint32_t)m) return C_drop_unplanned;
        int j = 0;   /* every group planned for this round, every block announced */
        for (uint32_t i = 0; i < v.nseg; i++) {
            int64_t g = rd32(v.groups + 4ull * i);
            while (j < sp->round.g && sp->round.groups[j] < g) j++;
            if (j == sp->round.g || sp->round.groups[j] != g) return C_drop_unplanned;
            const uint32_t *u = sp->round.unions + (size_t)j * words;
            for (int w = 0; w < words; w++)
                if (rd32(v.masks + 4ull * ((uint64_t)i * words + w)) & ~u[w])
                    return C_drop_unplanned;
        }
    }
    if (reserve_look(st, h->worker, v.nhead, width)) return C_drop_length;   /* out of memory */
    if (!sp->announce && v.nseg) {
        int j = 0;
        uint32_t *sums = (uint32_t *)(void *)(c->frame + DLC_HDR);
        const uint8_t *val = v.values;
        for (uint32_t i = 0; i < v.nseg; i++) {
            int64_t g = rd32(v.groups + 4ull * i);
            while (sp->round.groups[j] != g) j++;
            for (int blk = 0; blk < m; blk++) {
                if (!(rd32(v.masks + 4ull * ((uint64_t)i * words + blk / 32)) >> (blk % 32) & 1))
                    continue;
                uint32_t *acc = sums + (size_t)row_of(sp, words, j, blk) * (size_t)b;
                for (int e = 0; e < b; e++) acc[e] += rd32(val + 4u * (unsigned)e);
                val += 4u * (unsigned)b;
            }
        }
    }
    if (v.nhead) memcpy(st->look[h->worker], v.head, (size_t)v.nhead * (size_t)width * 4);
    st->nlook[h->worker] = (int)v.nhead;
    return -1;
}

/* -- the next round (planning.plan_round) ----------------------------------------------- */
typedef struct { int64_t group; int32_t exp; int full, order; const uint32_t *mask; } sp_row;

static int by_group(const void *a, const void *b) {   /* stable: ties keep their order */
    const sp_row *x = a, *y = b;
    if (x->group != y->group) return x->group < y->group ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

static int plan_round(const dlc_stream *st, int workers, int m, dlc_plan *out) {
    int words = (int)words_of((uint64_t)m), width = 2 + words, with = 0, total = 0;
    int64_t cap = INT64_MAX;
    out->g = 0; out->run = 0;
    for (int r = 0; r < workers; r++) {
        if (!st->nlook[r]) continue;
        with++;
        total += st->nlook[r];
        if (st->nlook[r] >= DLC_LOOKAHEAD) {
            int64_t last = st->look[r][(size_t)(st->nlook[r] - 1) * width];
            cap = last < cap ? last : cap;
        }
    }
    if (!with) return 0;
    sp_row *rows = malloc((size_t)total * sizeof *rows);
    if (!rows) return -2;
    int n = 0;
    for (int r = 0; r < workers; r++)
        for (int i = 0; i < st->nlook[r]; i++) {
            const uint32_t *row = st->look[r] + (size_t)i * width;
            if ((int64_t)row[0] > cap) continue;
            int bits = 0;
            for (int w = 0; w < words; w++) bits += __builtin_popcount(row[2 + w]);
            rows[n] = (sp_row){row[0], (int32_t)row[1], bits == m, n, row + 2};
            n++;
        }
    qsort(rows, (size_t)n, sizeof *rows, by_group);
    int groups = 0;
    for (int i = 0; i < n; i++) groups += !i || rows[i].group != rows[i - 1].group;
    if (plan_reserve(out, groups, words)) { free(rows); return -2; }
    int g = -1, run = -1, fulls = 0;
    for (int i = 0; i < n; i++) {
        if (!i || rows[i].group != rows[i - 1].group) {
            if (g >= 0 && run < 0 && fulls != workers) run = g;
            g++;
            fulls = 0;
            out->groups[g] = rows[i].group;
            out->exps[g] = rows[i].exp;
            memset(out->unions + (size_t)g * words, 0, (size_t)words * 4);
        }
        if (rows[i].exp > out->exps[g]) out->exps[g] = rows[i].exp;
        for (int w = 0; w < words; w++) out->unions[(size_t)g * words + w] |= rows[i].mask[w];
        fulls += rows[i].full;
    }
    if (run < 0 && fulls != workers) run = g;
    if (run < 0) run = groups;
    free(rows);
    if (with == workers && run >= 2) {   /* a dense run: every worker, every block */
        out->g = run; out->run = 1;
        return 0;
    }
    int take = 0, blocks = 0;   /* the smallest groups whose union fits one datagram */
    for (int i = 0; i < groups; i++) {
        for (int w = 0; w < words; w++) blocks += __builtin_popcount(out->unions[(size_t)i * words + w]);
        if (blocks > m) break;
        take++;
    }
    out->g = take > 1 ? take : 1;
    return 0;
}

/* -- finishing a round (sparse_rounds.finish_sparse) ------------------------------------ */
static int reserve_frame(dlc_job *job, dlc_sparse_copy *sp, size_t len) {
    size_t need = DLC_HDR + len + DLC_TAG;
    if (need <= sp->cap) return 0;
    uint8_t *frame = realloc(sp->frame, need);
    if (frame) sp->frame = frame;
    if (!frame) return -2;
    if (job->auth == AUTH_ENCRYPT) {
        uint8_t *cipher = realloc(sp->cipher, need);
        if (!cipher) return -2;
        sp->cipher = cipher;
    }
    sp->cap = need;
    return 0;
}

int dlc_sparse_finish(dlc_job *job, dlc_slot *s, dlc_copy *c) {
    dlc_stream *st = s->stream;
    dlc_sparse_copy *sp = c->sp;
    int m = job->m, b = job->block, words = (int)words_of((uint64_t)m);
    dlc_plan next = {0};
    if (plan_round(st, job->workers, m, &next)) { plan_free(&next); return -2; }
    const dlc_plan *plan = &next;
    int nseg = 0;   /* the planned groups of this round with a block: their sums */
    for (int i = 0; i < sp->round.g && !sp->announce; i++)
        for (int w = 0; w < words; w++)
            if (sp->round.unions[(size_t)i * words + w]) { nseg++; break; }
    size_t values = nseg ? (size_t)sp->nblocks * (size_t)b : 0;
    size_t len = 12 + 8u * (size_t)plan->g + 4u * (size_t)nseg * (1 + (size_t)words) + 4 * values;
    if (reserve_frame(job, sp, len)) { plan_free(&next); return -2; }
    uint8_t *p = sp->frame + DLC_HDR;
    wr32(p, (uint32_t)nseg); wr32(p + 4, (uint32_t)plan->g); wr32(p + 8, nseg ? (uint32_t)m : 0);
    p += 12;
    int32_t top = EXP_ZERO;
    for (int i = 0; i < plan->g; i++, p += 8) {
        wr32(p, (uint32_t)plan->groups[i]); wr32(p + 4, (uint32_t)plan->exps[i]);
        top = plan->exps[i] > top ? plan->exps[i] : top;
    }
    uint8_t *masks = p + 4u * (size_t)nseg;
    for (int i = 0; i < sp->round.g && nseg; i++) {
        const uint32_t *u = sp->round.unions + (size_t)i * words;
        int any = 0;
        for (int w = 0; w < words; w++) any |= u[w] != 0;
        if (!any) continue;
        wr32(p, (uint32_t)sp->round.groups[i]); p += 4;
        memcpy(masks, u, (size_t)words * 4); masks += 4u * (size_t)words;
    }
    if (values) memmove(masks, c->frame + DLC_HDR, 4 * values);
    c->numel = (uint16_t)values;
    c->exp = top;
    sp->len = len;
    c->run = next.run;
    if (next.run || !next.g) {
        st->pending_seq = -1;
    } else {   /* as the specification: seq + 1, not wrapped at 2^32 */
        st->pending_seq = c->seq + 1;
        dlc_plan old = st->pending;
        st->pending = next;
        next = old;
    }
    plan_free(&next);
    return 0;
}
