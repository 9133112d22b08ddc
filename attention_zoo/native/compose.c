/* DCMHA's Compose (and THA's static head mix) over the head axis of attention blocks, forward and backward, for
 * the CPU path of attention_zoo/variants/headmix.py. Built at first use by attention_zoo/native/__init__.py
 * (gcc -O3 -march=native, no fast-math: IEEE arithmetic, sums in a fixed order) and called through ctypes.
 *
 * A stage maps a block a[b, h, t, s] (one query row t and every key s; unit stride along s) to
 *   out[o] = Σ_i M[b,t,o,i] a[i] + kdd[b,o,s] a[o] + Σ_r k2[b,r,o,s] low[r],   low[r] = Σ_h k1[b,r,h,s] a[h]
 * where M is the per-row H×H matrix (identity, static mix, query-side rank-R terms and gate folded together; a
 * shared H×H matrix has zero batch and row strides), or the identity (copy), or nothing; the key-side terms are
 * optional. Backward, given g = ∂L/∂out:
 *   ∂a[i] = Σ_o M[o,i] g[o] + kdd[i] g[i] + Σ_r k1[r,i] glow[r],   glow[r] = Σ_o k2[r,o] g[o]
 *   ∂M[b,t,o,i] = Σ_s g[o] a[i],  ∂kdd[o,s] += Σ_t g[o] a[o],  ∂k2[r,o,s] += Σ_t g[o] low[r],
 *   ∂k1[r,h,s] += Σ_t a[h] glow[r].
 * Every pass reads the block once and writes it once, in chunks of W keys that stay in L1, and the loops over
 * the chunk vectorise. One call handles rows [t0, t1) of one batch row b: callers run calls for different (b, row
 * range) on different threads, each with its own key-side gradient buffers (summed by the caller).
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#define W 16        /* keys per chunk: one 512-bit vector of floats */
#define MAXH 32     /* heads */
#define MAXR 8      /* rank of the key-side terms */

enum { HEAD_NONE = 0, HEAD_COPY = 1, HEAD_MATRIX = 2 };

typedef struct {
    long sb, sh, st;  /* strides of a block: batch, head, row (the key stride is 1) */
} layout;

typedef struct {
    int head;              /* HEAD_NONE, HEAD_COPY or HEAD_MATRIX */
    const void *m;         /* M[b, t, o, i] at m + b*mb + t*mt + o*H + i */
    long mb, mt;
    const void *k1, *k2;   /* [B, R, H, S_all] at k + b*kb + r*kr + h*kh + s (NULL: no key terms) */
    const void *kdd;       /* [B, H, S_all] at kdd + b*db + h*dh + s */
    long kb, kr, kh, db, dh;
} stage;

typedef struct {           /* where a stage's weight gradients go (see compose_backward) */
    void *gm;              /* ∂M: rows [B, c, H, H] at gm + b*gmb + t*gmt, or per thread H×H at gm + thread*H*H */
    long gmb, gmt;
    int gm_shared;
    void *gk1, *gk2, *gkd; /* per-thread key-side buffers, thread strides kts / dts */
    long kts, dts;
} grads;

typedef struct {           /* head-shared masks of a block: keep[b, t, s] (bool), bias[b, h, t, s]; NULL: none */
    const unsigned char *keep;
    long kb, kt, ks;
    const void *bias;
    long bb, bh, bt, bs;
} masks;

#define INLINE static inline __attribute__((always_inline))

/* e^x for x ≤ 0 (a softmax's shifted logits), vectorisable: Cody–Waite reduction by ln 2 and Cephes' degree-6
 * polynomial, within about 1 ulp of expf; e^x is exactly 0 below −87.3 (2^-126), as a masked logit needs.
 * No library call and no floorf, so the loops over a chunk vectorise without fast-math. */
INLINE float exp_neg_f32(float x) {
    x = x < -104.0f ? -104.0f : x;
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  /* round to nearest: 1.5·2^23 */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float q = 1.9875691500e-4f;
    q = q * r + 1.3981999507e-3f;
    q = q * r + 8.3334519073e-3f;
    q = q * r + 4.1665795894e-2f;
    q = q * r + 1.6666665459e-1f;
    q = q * r + 5.0000001201e-1f;
    q = q * r * r + r + 1.0f;
    const int e = (int)n, bits = (e + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);  /* 2^e */
    return e < -126 ? 0.0f : q * scale;
}
INLINE double exp_neg_f64(double x) { return exp(x); }

#ifdef _OPENMP
#include <omp.h>
#define PARALLEL_FOR _Pragma("omp parallel for num_threads(nthreads) schedule(static)")
#define THREAD_NUM() omp_get_thread_num()
#else
#define PARALLEL_FOR
#define THREAD_NUM() 0
#endif

/* The row functions take H and R as arguments and are always inlined: the exported functions call them with
 * constants for the common shapes (H = 4, 8, 16 with R = 2), so the loops over heads unroll and a chunk's
 * vectors stay in registers, and with the runtime values otherwise. */
#define DEFINE_KERNELS(T, SUF)                                                                                       \
INLINE void fwd_chunk_##SUF(const stage *st, const int H, const int R, const int n, const T *restrict ar,          \
                            long ash, const T *restrict mr, const T *restrict k1b, const T *restrict k2b,           \
                            const T *restrict kdb, T *restrict orow, long osh) {                                    \
    T acc[MAXH][W];                                                                                                  \
    for (int o = 0; o < H; o++) {                                                                                    \
        const T *ao = ar + o * ash;                                                                                  \
        T *c = acc[o];                                                                                               \
        if (st->head == HEAD_COPY) { for (int j = 0; j < n; j++) c[j] = ao[j]; }                                     \
        else { for (int j = 0; j < n; j++) c[j] = 0; }                                                               \
    }                                                                                                                \
    if (mr) {                                                                                                        \
        for (int i = 0; i < H; i++) {                                                                                \
            const T *ai = ar + i * ash;                                                                              \
            T av[W];                                                                                                 \
            for (int j = 0; j < n; j++) av[j] = ai[j];                                                               \
            for (int o = 0; o < H; o++) {                                                                            \
                const T m = mr[o * H + i];                                                                           \
                T *c = acc[o];                                                                                       \
                for (int j = 0; j < n; j++) c[j] += m * av[j];                                                       \
            }                                                                                                        \
        }                                                                                                            \
    }                                                                                                                \
    if (k1b) {                                                                                                       \
        T low[MAXR][W];                                                                                              \
        for (int r = 0; r < R; r++) for (int j = 0; j < n; j++) low[r][j] = 0;                                       \
        for (int h = 0; h < H; h++) {                                                                                \
            const T *ah = ar + h * ash, *g = kdb + h * st->dh;                                                       \
            for (int r = 0; r < R; r++) {                                                                            \
                const T *w1 = k1b + r * st->kr + h * st->kh;                                                         \
                for (int j = 0; j < n; j++) low[r][j] += w1[j] * ah[j];                                              \
            }                                                                                                        \
            for (int j = 0; j < n; j++) acc[h][j] += g[j] * ah[j];                                                   \
        }                                                                                                            \
        for (int o = 0; o < H; o++)                                                                                  \
            for (int r = 0; r < R; r++) {                                                                            \
                const T *w2 = k2b + r * st->kr + o * st->kh;                                                         \
                for (int j = 0; j < n; j++) acc[o][j] += w2[j] * low[r][j];                                          \
            }                                                                                                        \
    }                                                                                                                \
    for (int o = 0; o < H; o++) { T *d = orow + o * osh; for (int j = 0; j < n; j++) d[j] = acc[o][j]; }             \
}                                                                                                                    \
                                                                                                                     \
INLINE void fwd_rows_##SUF(const stage *st, const int H, const int R, int S, int b, int t0, int t1, const T *a,  \
                           layout la, T *out, layout lo) {                                                           \
    const T *M = (const T *)st->m, *K1 = (const T *)st->k1, *K2 = (const T *)st->k2, *KD = (const T *)st->kdd;    \
    for (int t = t0; t < t1; t++) {                                                                                  \
        const T *ar = a + b * la.sb + t * la.st;                                                                     \
        T *orow = out + b * lo.sb + t * lo.st;                                                                       \
        const T *mr = st->head == HEAD_MATRIX ? M + b * st->mb + t * st->mt : NULL;                                  \
        for (int s0 = 0; s0 < S; s0 += W) {                                                                          \
            const T *k1b = K1 ? K1 + b * st->kb + s0 : NULL, *k2b = K1 ? K2 + b * st->kb + s0 : NULL;               \
            const T *kdb = K1 ? KD + b * st->db + s0 : NULL;                                                         \
            if (S - s0 >= W) fwd_chunk_##SUF(st, H, R, W, ar + s0, la.sh, mr, k1b, k2b, kdb, orow + s0, lo.sh);     \
            else fwd_chunk_##SUF(st, H, R, S - s0, ar + s0, la.sh, mr, k1b, k2b, kdb, orow + s0, lo.sh);            \
        }                                                                                                            \
    }                                                                                                                \
}                                                                                                                    \
                                                                                                                     \
INLINE void stage_row_fwd_##SUF(const stage *st, const int H, const int R, int S, int b, int t, const T *ar,     \
                                long ash, T *orow, long osh) {                                                       \
    const T *M = (const T *)st->m, *K1 = (const T *)st->k1, *K2 = (const T *)st->k2, *KD = (const T *)st->kdd;    \
    const T *mr = st->head == HEAD_MATRIX ? M + b * st->mb + t * st->mt : NULL;                                      \
    for (int s0 = 0; s0 < S; s0 += W) {                                                                              \
        const T *k1b = K1 ? K1 + b * st->kb + s0 : NULL, *k2b = K1 ? K2 + b * st->kb + s0 : NULL;                   \
        const T *kdb = K1 ? KD + b * st->db + s0 : NULL;                                                             \
        if (S - s0 >= W) fwd_chunk_##SUF(st, H, R, W, ar + s0, ash, mr, k1b, k2b, kdb, orow + s0, osh);             \
        else fwd_chunk_##SUF(st, H, R, S - s0, ar + s0, ash, mr, k1b, k2b, kdb, orow + s0, osh);                    \
    }                                                                                                                \
}                                                                                                                    \
                                                                                                                     \
/* Softmax over x[0, S) in place, after the bias and the keep mask (masked logits set to neg). */                   \
INLINE void softmax_row_##SUF(T *x, int S, const masks *mk, int b, int h, int t, T neg) {                          \
    if (mk->bias) {                                                                                                  \
        const T *bias = (const T *)mk->bias + b * mk->bb + h * mk->bh + t * mk->bt;                                  \
        for (int s = 0; s < S; s++) x[s] += bias[s * mk->bs];                                                        \
    }                                                                                                                \
    if (mk->keep) {                                                                                                  \
        const unsigned char *keep = mk->keep + b * mk->kb + t * mk->kt;                                              \
        for (int s = 0; s < S; s++) x[s] = keep[s * mk->ks] ? x[s] : neg;                                            \
    }                                                                                                                \
    T lane[W];                                                                                                       \
    for (int j = 0; j < W; j++) lane[j] = -INFINITY;                                                                 \
    int s0 = 0;                                                                                                      \
    for (; s0 + W <= S; s0 += W) for (int j = 0; j < W; j++) lane[j] = x[s0 + j] > lane[j] ? x[s0 + j] : lane[j];  \
    for (int j = 0; s0 + j < S; j++) lane[j] = x[s0 + j] > lane[j] ? x[s0 + j] : lane[j];                          \
    T mx = lane[0];                                                                                                  \
    for (int j = 1; j < W; j++) mx = lane[j] > mx ? lane[j] : mx;                                                    \
    for (int j = 0; j < W; j++) lane[j] = 0;                                                                         \
    for (s0 = 0; s0 + W <= S; s0 += W)                                                                               \
        for (int j = 0; j < W; j++) { const T e = exp_neg_##SUF(x[s0 + j] - mx); x[s0 + j] = e; lane[j] += e; }    \
    for (int j = 0; s0 + j < S; j++) { const T e = exp_neg_##SUF(x[s0 + j] - mx); x[s0 + j] = e; lane[j] += e; }  \
    T sum = 0;                                                                                                       \
    for (int j = 0; j < W; j++) sum += lane[j];                                                                      \
    const T inv = (T)1 / sum;                                                                                        \
    for (int s = 0; s < S; s++) x[s] *= inv;                                                                         \
}                                                                                                                    \
                                                                                                                     \
/* One row of the whole forward: w = softmax(mask(pre(a0))) into w, p = post(w) into p. */                          \
INLINE void fused_fwd_row_##SUF(const stage *pre, const stage *post, const int H, const int Rq, const int Rp,     \
                                int S, int b, int t, const T *a0, layout la, const masks *mk, T neg, T *w,          \
                                layout lw, T *p, layout lp) {                                                        \
    const T *ar = a0 + b * la.sb + t * la.st;                                                                        \
    T *wr = w + b * lw.sb + t * lw.st;                                                                               \
    if (pre) stage_row_fwd_##SUF(pre, H, Rq, S, b, t, ar, la.sh, wr, lw.sh);                                         \
    else for (int h = 0; h < H; h++) memcpy(wr + h * lw.sh, ar + h * la.sh, S * sizeof(T));                        \
    for (int h = 0; h < H; h++) softmax_row_##SUF(wr + h * lw.sh, S, mk, b, h, t, neg);                              \
    if (post) stage_row_fwd_##SUF(post, H, Rp, S, b, t, wr, lw.sh, p + b * lp.sb + t * lp.st, lp.sh);               \
}                                                                                                                    \
                                                                                                                     \
void fused_forward_##SUF(const stage *pre, const stage *post, int H, int Rq, int Rp, int S, int B, int c,        \
                         int nthreads, const T *a0, layout la, const masks *mk, double neg, T *w, layout lw, T *p,  \
                         layout lp) {                                                                                \
    PARALLEL_FOR                                                                                                     \
    for (long bt = 0; bt < (long)B * c; bt++) {                                                                      \
        const int b = (int)(bt / c), t = (int)(bt % c);                                                              \
        if (H == 8 && Rq == 2 && Rp == 2)                                                                            \
            fused_fwd_row_##SUF(pre, post, 8, 2, 2, S, b, t, a0, la, mk, (T)neg, w, lw, p, lp);                      \
        else if (H == 4 && Rq == 2 && Rp == 2)                                                                       \
            fused_fwd_row_##SUF(pre, post, 4, 2, 2, S, b, t, a0, la, mk, (T)neg, w, lw, p, lp);                      \
        else                                                                                                         \
            fused_fwd_row_##SUF(pre, post, H, Rq, Rp, S, b, t, a0, la, mk, (T)neg, w, lw, p, lp);                    \
    }                                                                                                                \
}                                                                                                                    \
                                                                                                                     \
/* out = stage(a) on every row of every batch row (keys [0, S)), the rows spread over the OpenMP team. */           \
void compose_forward_##SUF(const stage *st, int H, int R, int S, int B, int c, int nthreads,                    \
                           const T *a, layout la, T *out, layout lo) {                                              \
    PARALLEL_FOR                                                                                                     \
    for (long bt = 0; bt < (long)B * c; bt++) {                                                                      \
        const int b = (int)(bt / c), t = (int)(bt % c);                                                              \
        if (H == 8 && R == 2) fwd_rows_##SUF(st, 8, 2, S, b, t, t + 1, a, la, out, lo);                              \
        else if (H == 4 && R == 2) fwd_rows_##SUF(st, 4, 2, S, b, t, t + 1, a, la, out, lo);                         \
        else if (H == 16 && R == 2) fwd_rows_##SUF(st, 16, 2, S, b, t, t + 1, a, la, out, lo);                       \
        else fwd_rows_##SUF(st, H, R, S, b, t, t + 1, a, la, out, lo);                                               \
    }                                                                                                                \
}                                                                                                                    \
                                                                                                                     \
INLINE void bwd_chunk_##SUF(const stage *st, const int H, const int R, const int n, const T *restrict ar,          \
                            long ash, const T *restrict gr, long gsh, T *restrict gar, long gash,                   \
                            const T *restrict mr, const T *restrict k1b, const T *restrict k2b,   \
                            const T *restrict kdb, T *restrict gk1, T *restrict gk2, T *restrict gkd) {             \
    T acc[MAXH][W];                                                                                                  \
    for (int i = 0; i < H; i++) {                                                                                    \
        const T *gi = gr + i * gsh;                                                                                  \
        T *c = acc[i];                                                                                               \
        if (st->head == HEAD_COPY) { for (int j = 0; j < n; j++) c[j] = gi[j]; }                                     \
        else { for (int j = 0; j < n; j++) c[j] = 0; }                                                               \
    }                                                                                                                \
    if (mr) {                                                                                                        \
        for (int i = 0; i < H; i++) {                                                                                \
            T *c = acc[i];                                                                                           \
            for (int o = 0; o < H; o++) {                                                                            \
                const T m = mr[o * H + i], *go = gr + o * gsh;                                                       \
                for (int j = 0; j < n; j++) c[j] += m * go[j];                                                       \
            }                                                                                                        \
        }                                                                                                            \
    }                                                                                                                \
    if (k1b) {                                                                                                       \
        T low[MAXR][W], glow[MAXR][W];                                                                               \
        for (int r = 0; r < R; r++) for (int j = 0; j < n; j++) { low[r][j] = 0; glow[r][j] = 0; }                    \
        for (int h = 0; h < H; h++) {                                                                                \
            const T *ah = ar + h * ash, *gh = gr + h * gsh;                                                          \
            for (int r = 0; r < R; r++) {                                                                            \
                const T *w1 = k1b + r * st->kr + h * st->kh, *w2 = k2b + r * st->kr + h * st->kh;                    \
                for (int j = 0; j < n; j++) { low[r][j] += w1[j] * ah[j]; glow[r][j] += w2[j] * gh[j]; }             \
            }                                                                                                        \
        }                                                                                                            \
        for (int h = 0; h < H; h++) {                                                                                \
            const T *ah = ar + h * ash, *gh = gr + h * gsh, *d = kdb + h * st->dh;                                   \
            T *gd = gkd + h * st->dh, *c = acc[h];                                                                   \
            for (int j = 0; j < n; j++) { c[j] += d[j] * gh[j]; gd[j] += gh[j] * ah[j]; }                            \
            for (int r = 0; r < R; r++) {                                                                            \
                const T *w1 = k1b + r * st->kr + h * st->kh;                                                         \
                T *g1 = gk1 + r * st->kr + h * st->kh, *g2 = gk2 + r * st->kr + h * st->kh;                          \
                for (int j = 0; j < n; j++) {                                                                        \
                    c[j] += w1[j] * glow[r][j];                                                                      \
                    g1[j] += ah[j] * glow[r][j];                                                                     \
                    g2[j] += gh[j] * low[r][j];                                                                      \
                }                                                                                                    \
            }                                                                                                        \
        }                                                                                                            \
    }                                                                                                                \
    for (int i = 0; i < H; i++) { T *d = gar + i * gash; for (int j = 0; j < n; j++) d[j] = acc[i][j]; }            \
}                                                                                                                    \
                                                                                                                     \
INLINE void bwd_rows_##SUF(const stage *st, const int H, const int R, int S, int b, int t0, int t1, const T *a,  \
                           layout la, const T *g, layout lg, T *ga, layout lga, T *gm, long gmt, int gm_shared,     \
                           T *gk1, T *gk2, T *gkd) {                                                                 \
    const T *M = (const T *)st->m, *K1 = (const T *)st->k1, *K2 = (const T *)st->k2, *KD = (const T *)st->kdd;    \
    for (int t = t0; t < t1; t++) {                                                                                  \
        const T *ar = a + b * la.sb + t * la.st, *gr = g + b * lg.sb + t * lg.st;                                    \
        T *gar = ga + b * lga.sb + t * lga.st;                                                                       \
        const T *mr = st->head == HEAD_MATRIX ? M + b * st->mb + t * st->mt : NULL;                                  \
        if (mr && gm) { /* ∂M[o, i] = Σ_s g[o] a[i]: per o, H lane-wise sums over the row (in registers) */       \
            T *gmr = gm_shared ? gm : gm + t * gmt;                                                                  \
            for (int o = 0; o < H; o++) {                                                                            \
                const T *go = gr + o * lg.sh;                                                                        \
                T part[MAXH][W];                                                                                     \
                for (int i = 0; i < H; i++) for (int j = 0; j < W; j++) part[i][j] = 0;                              \
                int s0 = 0;                                                                                          \
                for (; s0 + W <= S; s0 += W)                                                                         \
                    for (int i = 0; i < H; i++) {                                                                    \
                        const T *ai = ar + i * la.sh + s0;                                                           \
                        for (int j = 0; j < W; j++) part[i][j] += go[s0 + j] * ai[j];                                \
                    }                                                                                                \
                for (int i = 0; i < H; i++) {                                                                        \
                    const T *ai = ar + i * la.sh;                                                                    \
                    for (int j = 0; s0 + j < S; j++) part[i][j] += go[s0 + j] * ai[s0 + j];                          \
                    T sum = 0;                                                                                       \
                    for (int j = 0; j < W; j++) sum += part[i][j];                                                   \
                    if (gm_shared) gmr[o * H + i] += sum; else gmr[o * H + i] = sum;                                 \
                }                                                                                                    \
            }                                                                                                        \
        }                                                                                                            \
        for (int s0 = 0; s0 < S; s0 += W) {                                                                          \
            const T *k1b = K1 ? K1 + b * st->kb + s0 : NULL, *k2b = K1 ? K2 + b * st->kb + s0 : NULL;               \
            const T *kdb = K1 ? KD + b * st->db + s0 : NULL;                                                         \
            T *g1 = K1 ? gk1 + s0 : NULL, *g2 = K1 ? gk2 + s0 : NULL, *gd = K1 ? gkd + s0 : NULL;                    \
            if (S - s0 >= W)                                                                                         \
                bwd_chunk_##SUF(st, H, R, W, ar + s0, la.sh, gr + s0, lg.sh, gar + s0, lga.sh, mr, k1b, k2b,     \
                                kdb, g1, g2, gd);                                                                    \
            else                                                                                                     \
                bwd_chunk_##SUF(st, H, R, S - s0, ar + s0, la.sh, gr + s0, lg.sh, gar + s0, lga.sh, mr, k1b,     \
                                k2b, kdb, g1, g2, gd);                                                               \
        }                                                                                                            \
    }                                                                                                                \
}                                                                                                                    \
                                                                                                                     \
/* ga = ∂a from g on every row, the rows spread over the OpenMP team. gm: ∂M, [B, c, H, H] at gm + b*gmb + t*gmt  \
 * (written), or for a shared matrix (gm_shared) one H×H sum per thread at gm + thread*H*H (accumulated); NULL:     \
 * not wanted. gk1, gk2, gkd: key-side gradients, one buffer per thread (thread stride kts / dts, inside it the      \
 * strides of k1 / kdd), accumulated. The caller sums the per-thread buffers. */                                    \
void compose_backward_##SUF(const stage *st, int H, int R, int S, int B, int c, int nthreads,                   \
                            const T *a, layout la, const T *g, layout lg, T *ga, layout lga,                        \
                            T *gm, long gmb, long gmt, int gm_shared, T *gk1, T *gk2, T *gkd, long kts, long dts) { \
    PARALLEL_FOR                                                                                                     \
    for (long bt = 0; bt < (long)B * c; bt++) {                                                                      \
        const int b = (int)(bt / c), t = (int)(bt % c), th = THREAD_NUM();                                           \
        T *gmr = !gm ? NULL : gm_shared ? gm + (long)th * H * H : gm + b * gmb;                                      \
        T *g1 = gk1 ? gk1 + th * kts + b * st->kb : NULL, *g2 = gk2 ? gk2 + th * kts + b * st->kb : NULL;           \
        T *gd = gkd ? gkd + th * dts + b * st->db : NULL;                                                            \
        if (H == 8 && R == 2)                                                                                        \
            bwd_rows_##SUF(st, 8, 2, S, b, t, t + 1, a, la, g, lg, ga, lga, gmr, gmt, gm_shared, g1, g2, gd);        \
        else if (H == 4 && R == 2)                                                                                   \
            bwd_rows_##SUF(st, 4, 2, S, b, t, t + 1, a, la, g, lg, ga, lga, gmr, gmt, gm_shared, g1, g2, gd);        \
        else if (H == 16 && R == 2)                                                                                  \
            bwd_rows_##SUF(st, 16, 2, S, b, t, t + 1, a, la, g, lg, ga, lga, gmr, gmt, gm_shared, g1, g2, gd);       \
        else                                                                                                         \
            bwd_rows_##SUF(st, H, R, S, b, t, t + 1, a, la, g, lg, ga, lga, gmr, gmt, gm_shared, g1, g2, gd);        \
    }                                                                                                                \
}                                                                                                                     \
INLINE void stage_row_bwd_##SUF(const stage *st, const grads *gs, const int H, const int R, int S, int b, int t,  \
                                int th, const T *ar, long ash, const T *gr, long gsh, T *gar, long gash) {          \
    T *gm = (T *)gs->gm;                                                                                             \
    T *gmr = !gm ? NULL : gs->gm_shared ? gm + (long)th * H * H : gm + b * gs->gmb;                                  \
    T *g1 = gs->gk1 ? (T *)gs->gk1 + th * gs->kts + b * st->kb : NULL;                                               \
    T *g2 = gs->gk2 ? (T *)gs->gk2 + th * gs->kts + b * st->kb : NULL;                                               \
    T *gd = gs->gkd ? (T *)gs->gkd + th * gs->dts + b * st->db : NULL;                                               \
    layout la = {0, ash, 0}, lg = {0, gsh, 0}, lga = {0, gash, 0};                                                   \
    /* bwd_rows reads rows through (b, t) offsets: hand it row pointers with zero batch/row strides */               \
    stage one = *st;                                                                                                 \
    one.m = st->head == HEAD_MATRIX ? (const T *)st->m + b * st->mb + t * st->mt : NULL;                             \
    one.mb = one.mt = 0;                                                                                             \
    one.k1 = st->k1 ? (const T *)st->k1 + b * st->kb : NULL;                                                         \
    one.k2 = st->k2 ? (const T *)st->k2 + b * st->kb : NULL;                                                         \
    one.kdd = st->kdd ? (const T *)st->kdd + b * st->db : NULL;                                                      \
    one.kb = one.db = 0;                                                                                             \
    T *gmt = gmr && !gs->gm_shared ? gmr + t * gs->gmt : gmr;                                                        \
    bwd_rows_##SUF(&one, H, R, S, 0, 0, 1, ar, la, gr, lg, gar, lga, gmt, 0, gs->gm_shared, g1, g2, gd);            \
}                                                                                                                    \
                                                                                                                     \
/* One row of the whole backward: p = post(w) into p (for ∂V), ∂w = postᵀ(∂p) and the softmax backward ∂l =      \
 * w (∂w − Σ_s ∂w w) in the thread's scratch row x ([H, S]), ∂a0 = preᵀ(∂l) into ga. */                           \
INLINE void fused_bwd_row_##SUF(const stage *pre, const stage *post, const grads *gpre, const grads *gpost,       \
                                const int H, const int Rq, const int Rp, int S, int b, int t, int th, const T *a0,  \
                                layout la, const T *w, layout lw, const T *gp, layout lgp, T *p, layout lp, T *ga,  \
                                layout lga, T *x) {                                                                  \
    const T *wr = w + b * lw.sb + t * lw.st, *gpr = gp + b * lgp.sb + t * lgp.st;                                    \
    T *gar = ga + b * lga.sb + t * lga.st;                                                                           \
    T *xr = pre ? x : gar;  /* without a pre stage ∂l is ∂a0 */                                                      \
    const long xsh = pre ? S : lga.sh;                                                                               \
    if (post) {                                                                                                      \
        stage_row_fwd_##SUF(post, H, Rp, S, b, t, wr, lw.sh, p + b * lp.sb + t * lp.st, lp.sh);                     \
        stage_row_bwd_##SUF(post, gpost, H, Rp, S, b, t, th, wr, lw.sh, gpr, lgp.sh, xr, xsh);                       \
    } else for (int h = 0; h < H; h++) memcpy(xr + h * xsh, gpr + h * lgp.sh, S * sizeof(T));                      \
    for (int h = 0; h < H; h++) {                                                                                    \
        T *xh = xr + h * xsh;                                                                                        \
        const T *y = wr + h * lw.sh;                                                                                 \
        T lane[W];                                                                                                   \
        for (int j = 0; j < W; j++) lane[j] = 0;                                                                     \
        int s0 = 0;                                                                                                  \
        for (; s0 + W <= S; s0 += W) for (int j = 0; j < W; j++) lane[j] += xh[s0 + j] * y[s0 + j];                 \
        for (int j = 0; s0 + j < S; j++) lane[j] += xh[s0 + j] * y[s0 + j];                                         \
        T dot = 0;                                                                                                   \
        for (int j = 0; j < W; j++) dot += lane[j];                                                                  \
        for (int s = 0; s < S; s++) xh[s] = y[s] * (xh[s] - dot);                                                    \
    }                                                                                                                \
    if (pre)                                                                                                         \
        stage_row_bwd_##SUF(pre, gpre, H, Rq, S, b, t, th, a0 + b * la.sb + t * la.st, la.sh, xr, xsh, gar,         \
                            lga.sh);                                                                                 \
}                                                                                                                    \
                                                                                                                     \
void fused_backward_##SUF(const stage *pre, const stage *post, const grads *gpre, const grads *gpost, int H,     \
                          int Rq, int Rp, int S, int B, int c, int nthreads, const T *a0, layout la, const T *w,     \
                          layout lw, const T *gp, layout lgp, T *p, layout lp, T *ga, layout lga, T *scratch) {     \
    PARALLEL_FOR                                                                                                     \
    for (long bt = 0; bt < (long)B * c; bt++) {                                                                      \
        const int b = (int)(bt / c), t = (int)(bt % c), th = THREAD_NUM();                                           \
        T *x = scratch + (long)th * H * S;                                                                           \
        if (H == 8 && Rq == 2 && Rp == 2)                                                                            \
            fused_bwd_row_##SUF(pre, post, gpre, gpost, 8, 2, 2, S, b, t, th, a0, la, w, lw, gp, lgp, p, lp, ga,     \
                                lga, x);                                                                             \
        else if (H == 4 && Rq == 2 && Rp == 2)                                                                       \
            fused_bwd_row_##SUF(pre, post, gpre, gpost, 4, 2, 2, S, b, t, th, a0, la, w, lw, gp, lgp, p, lp, ga,     \
                                lga, x);                                                                             \
        else                                                                                                         \
            fused_bwd_row_##SUF(pre, post, gpre, gpost, H, Rq, Rp, S, b, t, th, a0, la, w, lw, gp, lgp, p, lp, ga,   \
                                lga, x);                                                                             \
    }                                                                                                                \
}

DEFINE_KERNELS(float, f32)
DEFINE_KERNELS(double, f64)

int compose_limits(int *max_heads, int *max_rank) {
    *max_heads = MAXH;
    *max_rank = MAXR;
    return W;
}
