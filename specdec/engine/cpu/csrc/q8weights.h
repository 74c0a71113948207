/* The gguf-q8 kernel's weight units: their chunks and scales unpacked from the repacked layout (q8unit.h),
 * and the float steps that turn a unit's integer sums against one activation row into its terms. Part of
 * q8dot.c's translation unit, after q8level.h. */
#ifndef SPECDEC_Q8WEIGHTS_H
#define SPECDEC_Q8WEIGHTS_H

/* cb bytes at p (CHUNK, or CHUNK / 2 for a half unit), the rest of the chunk zero. With AVX-512 a half unit's by
 * one 32-byte load: through memory (a copy into a zeroed vector) each cost a store-forwarding stall. */
static inline __attribute__((always_inline)) vw load_chunk(const uint8_t *p, int cb) {
    vw v = {0};
#if CHUNK == 64
    if (cb == CHUNK / 2) {
        const __m512i loaded = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)p));
        memcpy(&v, &loaded, CHUNK);
        return v;
    }
#endif
    memcpy(&v, p, cb);
    return v;
}

/* Chunk 2h + high's 4-bit quants, from the nibble bytes of half h at p. */
static inline vw nibbles(const uint8_t *p, int high, int cb) {
    return (high ? load_chunk(p, cb) >> 4 : load_chunk(p, cb)) & BYTES(15);
}

/* Chunk c's bits of one plane, as 0 or 1 a byte, from a unit's words at p (the 5th bits of Q5_0 and Q5_K; q8pack.c
 * lays them out). */
static inline vw plane_bits(const uint8_t *p, int c, int cb) {
    const int per_word = 64 / cb;
    vw lane;
    for (int i = 0; i < CHUNK / 8; i++) lane[i] = i;
    uint64_t word;
    memcpy(&word, p + 8 * (c / per_word), 8);
    const vw shift = lane + (uint64_t)((cb / 8) * (c % per_word));
    return (((vw){0} + word) >> shift) & BYTES(1);
}

/* Chunk c's two bits of a pair (Q6_K's high pair, Q3_K's low one, Q2_K's code), as 0..3 a byte, from the pair bytes
 * at p. */
static inline vw pair_bits(const uint8_t *p, int c, int cb) {
    return (load_chunk(p + cb * (c / 4), cb) >> (2 * (c % 4))) & BYTES(3);
}

/* Chunk c's two bits of a pair, as pair_bits has them, times 16 (0, 16, 32 or 48 a byte): Q6_K's high pair in place
 * above its nibble. One shift (none for c % 4 = 2) and one mask: a 64-bit lane's shift moves the neighbouring
 * bytes' bits only into bits the mask clears. */
static inline vw pair_bits_high(const uint8_t *p, int c, int cb) {
    const vw bytes = load_chunk(p + cb * (c / 4), cb);
    const int at = 2 * (c % 4); /* the pair's lowest bit, to go to bit 4 */
    return (at <= 4 ? bytes << (4 - at) : bytes >> (at - 4)) & BYTES(0x30);
}

/* Chunk c's Q3_K third bits, as 0 or 4 a byte, from the bytes at p (bit c of byte p is chunk c's): one shift, one
 * mask (a 64-bit lane's shift moves the neighbouring bytes' bits only into bits the mask clears). */
static inline vw third_bits(const uint8_t *p, int c, int cb) {
    const vw bits = load_chunk(p, cb);
    return (c >= 2 ? bits >> (c - 2) : bits << (2 - c)) & BYTES(4);
}

/* Whether a format's block sums are two 16-weight halves weighed by integer scales: Q6_K's, Q3_K's and Q2_K's. */
static inline int half_scaled(const int type) { return type == Q6_K || type == Q3_K || type == Q2_K; }

/* Whether their codes have an offset: Q6_K's 32 and Q3_K's 4 (Q2_K's min term is apart: `q2_k_min_sums`). */
static inline int half_offset(const int type) { return type == Q6_K || type == Q3_K; }

/* That offset, 32 or 4, as a shift. */
static inline int half_offset_shift(const int type) { return type == Q6_K ? 5 : 2; }

/* The unit's BLOCKS bytes at p (unsigned), one a lane, as int32. */
static inline vli byte_lanes(const uint8_t *p) {
    vli out;
#if CHUNK == 64
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    memcpy(&out, &v, 64);
#elif defined(__AVX2__)
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    memcpy(&out, &v, 32);
#else
    for (int l = 0; l < BLOCKS; l++) out[l] = p[l];
#endif
    return out;
}

/* 2 · BLOCKS int8 at p as int16, two a lane (the half scales of each block of Q6_K, and of Q3_K as repacked). */
static inline vli byte_pairs(const int8_t *p) {
    vli out;
#if CHUNK == 64
    const __m512i v = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p));
    memcpy(&out, &v, 64);
#elif defined(__AVX2__)
    const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    memcpy(&out, &v, 32);
#else
    for (int l = 0; l < BLOCKS; l++) out[l] = (int32_t)((uint32_t)(uint16_t)p[2 * l] | (uint32_t)(uint16_t)p[2 * l + 1] << 16);
#endif
    return out;
}

/* The low (or, if `high`, the high) nibbles of 2 · BLOCKS bytes at p as int16, two a lane: Q2_K's half scales (or
 * mins) of each block. */
static inline vli nibble_pairs(const uint8_t *p, int high) {
    vli out;
#if CHUNK == 64
    const __m256i b = _mm256_loadu_si256((const __m256i *)p);
    const __m512i v = _mm512_cvtepu8_epi16(_mm256_and_si256(high ? _mm256_srli_epi16(b, 4) : b, _mm256_set1_epi8(15)));
    memcpy(&out, &v, 64);
#elif defined(__AVX2__)
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    const __m256i v = _mm256_cvtepu8_epi16(_mm_and_si128(high ? _mm_srli_epi16(b, 4) : b, _mm_set1_epi8(15)));
    memcpy(&out, &v, 32);
#else
    for (int l = 0; l < BLOCKS; l++) {
        const uint32_t first = (p[2 * l] >> (4 * high)) & 15, second = (p[2 * l + 1] >> (4 * high)) & 15;
        out[l] = (int32_t)(first | second << 16);
    }
#endif
    return out;
}

/* BLOCKS float16 scales at p, one a lane; of a half unit (`half`), the first 8 and zeros. */
static inline vl half_lanes(const uint8_t *p, int half) {
    vl out;
    (void)half; /* the 32-byte chunk builds have no half units */
#if CHUNK == 64
    const __m512 f = half ? _mm512_zextps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)))
                          : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    memcpy(&out, &f, 64);
#elif defined(__F16C__)
    const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    memcpy(&out, &f, 32);
#else
    for (int l = 0; l < BLOCKS; l++) out[l] = half_to_float(p + 2 * l);
#endif
    return out;
}

/* Lane l: the float16 at p + 2 · (l / 8), its super-block's (8 blocks a super-block); of a half unit, one. */
static inline vl superblock_lanes(const uint8_t *p, int half) {
    vl out;
#if CHUNK == 64 /* two super-blocks a unit: both converted at once, then 8 lanes each by one permutation (GCC
                 * built it from 8 masked broadcasts; on a Zen 4, cached, a Q4_K unit at one row 0.83x the time) */
    uint32_t pair;
    memcpy(&pair, p, 4);
    if (half) pair &= 0xffff; /* one super-block: the other lanes +0 */
    const __m512 f = _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                                           _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)pair))));
    memcpy(&out, &f, 64);
#else
    (void)half;
    out = (vl){0} + half_to_float(p);
#endif
    return out;
}

/* The formats whose codes are signed bytes: Q8_0's, and IQ4_NL's and IQ4_XS's table values (-127..113). */
static inline int signed_codes(const int type) { return type == Q8_0 || type == IQ4_NL || type == IQ4_XS; }

/* With VNNI, signed codes q go in as q + 128 (unsigned: each byte's top bit flipped) and their block sums take
 * 128 · Σu off (`centred`), as Q4_0's and Q5_0's codes do: the integer sum is the same, and no sign is moved onto
 * the activations, so they go every way the other formats go (chunk by chunk, in pairs). Without VNNI
 * vpmaddubsw's int16 pair sums would saturate (2 · 255 · 127), so there |q| and its sign stay. */
#if !defined(PAIRS) && defined(NATIVE)
#define SIGNED_OFFSET 1
#else
#define SIGNED_OFFSET 0
#endif

/* Whether this format's weights go in as |q| with their sign moved onto the activations (signed codes without
 * VNNI): then a unit takes twice the registers, and goes in pairs only in the AVX2 build (q8grouped.h). */
static inline int sign_on_activations(const int type) { return signed_codes(type) && !SIGNED_OFFSET; }

/* A chunk's table indices (0..15 a byte) as IQ4's values: + 128 where signed codes go in offset (SIGNED_OFFSET),
 * else as int8 bytes. One byte shuffle a 16-byte lane. */
static inline vw iq4_values(vw index) {
    vw out;
#if defined(Q8_PORTABLE)
    uint8_t bytes[CHUNK];
    memcpy(bytes, &index, CHUNK);
    for (int k = 0; k < CHUNK; k++) bytes[k] = (uint8_t)IQ4_VALUES[bytes[k]];
    memcpy(&out, bytes, CHUNK);
#else
    const __m128i table = _mm_xor_si128(_mm_loadu_si128((const __m128i *)IQ4_VALUES),
                                        _mm_set1_epi8(SIGNED_OFFSET ? (char)0x80 : 0));
#if CHUNK == 64
    const __m512i v = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(table), (__m512i)index);
#elif defined(__AVX2__)
    const __m256i v = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), (__m256i)index);
#else /* SSE4.1: two 16-byte halves */
    __m128i v[2];
    memcpy(v, &index, CHUNK);
    for (int h = 0; h < 2; h++) v[h] = _mm_shuffle_epi8(table, v[h]);
#endif
    memcpy(&out, &v, CHUNK);
#endif
    return out;
}

/* What one unit of a weight row needs, unpacked once per pass. */
typedef struct {
    nv w[NVS], sign[NVS]; /* sign: signed codes without VNNI only */
    vl s, m;              /* the blocks' scales, and Q4_K's and Q5_K's mins (Q4_1's and Q5_1's, negated; Q2_K's dmin) */
    vli scale[2];         /* Q6_K, Q3_K and Q2_K without VNNI: the half scales as unit_dot takes them */
    vli scale_pairs;      /* Q6_K and Q3_K without VNNI: (sc₁, sc₂) as int16, for the offset's Σ sc·Σu */
    vl half_scale[2];     /* Q6_K, Q3_K and Q2_K with VNNI: sc₁ and sc₂ as floats */
    vli min_pairs;        /* Q2_K: its half mins (m₁, m₂) as int16 */
} unit_weights;

/* Chunk c's weights as unsigned bytes, of the unit at o (of sbu super-blocks, chunks of cb bytes: a half unit
 * if cb is CHUNK / 2, whose lanes past 8 read other bytes, finite, against zero activations); signed codes (Q8_0's,
 * IQ4's values) as q + 128 with VNNI (SIGNED_OFFSET), else as they are. */
static inline __attribute__((always_inline)) vw weight_chunk(const int type, const uint8_t *o, const int c,
                                                             const int sbu, const int cb) {
    if (type == Q8_0) return load_chunk(o + 16 * sbu + cb * c, cb) ^ BYTES(SIGNED_OFFSET ? 128 : 0);
    if (type == IQ4_NL) return iq4_values(nibbles(o + 16 * sbu + cb * (c / 2), c % 2, cb));
    if (type == IQ4_XS) return iq4_values(nibbles(o + 10 * sbu + cb * (c / 2), c % 2, cb));
    if (type == Q4_K) return nibbles(o + 20 * sbu + cb * (c / 2), c % 2, cb);
    if (type == Q5_K)
        return nibbles(o + 20 * sbu + cb * (c / 2), c % 2, cb) | plane_bits(o + 20 * sbu + 4 * cb, c, cb) << 4;
    if (type == Q6_K)
        return nibbles(o + 18 * sbu + cb * (c / 2), c % 2, cb) | pair_bits_high(o + 18 * sbu + 4 * cb, c, cb);
    if (type == Q3_K) return pair_bits(o + 18 * sbu, c, cb) | third_bits(o + 18 * sbu + 2 * cb, c, cb);
    if (type == Q2_K) return pair_bits(o + 20 * sbu, c, cb);
    const int64_t at = (type == Q4_1 || type == Q5_1 ? 32 : 16) * sbu; /* after d (and m) */
    const vw low = nibbles(o + at + cb * (c / 2), c % 2, cb); /* Q4_0's and Q4_1's codes, Q5_0's and Q5_1's low bits */
    return type == Q4_0 || type == Q4_1 ? low : low | plane_bits(o + at + 4 * cb, c, cb) << 4;
}

/* The half scales (sc₁, sc₂), int16 pairs a lane, as unit_dot (without VNNI) or scaled_halves_sum takes them. */
static inline void set_half_scales(unit_weights *u, vli pairs) {
    u->scale_pairs = pairs;
    if (SCALE_PAIRS) { /* (sc₁, sc₁) and (sc₂, sc₂) a lane */
        u->scale[0] = (vli)(((vlu)pairs & 0xffff) | ((vlu)pairs << 16));
        u->scale[1] = (vli)(((vlu)pairs & 0xffff0000u) | ((vlu)pairs >> 16));
    } else { /* the sign-extended int16s */
        u->half_scale[0] = __builtin_convertvector((vli)((vlu)pairs << 16) >> 16, vl);
        u->half_scale[1] = __builtin_convertvector(pairs >> 16, vl);
    }
}

/* The scales of the unit at o (a half unit if `half`): s, and m, scale, scale_pairs or half_scale by type. */
static inline __attribute__((always_inline)) void unpack_scales(const int type, const uint8_t *o, unit_weights *u,
                                                                const int half) {
    const int sbu = half ? 1 : SB_PER_UNIT;
    if (type == Q4_K || type == Q5_K) { /* a half unit's lanes past 8 read the mins' and quants' bytes: finite,
                                           * against zeros */
        u->s = __builtin_convertvector(byte_lanes(o + 4 * sbu), vl) * superblock_lanes(o, half);           /* d · sc */
        u->m = __builtin_convertvector(byte_lanes(o + 12 * sbu), vl) * superblock_lanes(o + 2 * sbu, half); /* dmin · m */
    } else if (type == Q2_K) { /* d and dmin; the half scales and mins from the scale bytes' nibbles */
        u->s = superblock_lanes(o, half);
        u->m = superblock_lanes(o + 2 * sbu, half);
        set_half_scales(u, nibble_pairs(o + 4 * sbu, 0));
        u->min_pairs = nibble_pairs(o + 4 * sbu, 1);
    } else if (half_scaled(type)) {
        u->s = superblock_lanes(o, half);
        set_half_scales(u, byte_pairs((const int8_t *)o + 2 * sbu));
    } else if (type == IQ4_XS) { /* d · (ls − 32); a half unit's lanes past 8 read its indices: finite */
        u->s = __builtin_convertvector(byte_lanes(o + 2 * sbu) - 32, vl) * superblock_lanes(o, half);
    } else { /* Q5_0, Q4_0, Q8_0 and IQ4_NL; Q4_1's and Q5_1's m negated: their min term is added */
        u->s = half_lanes(o, half);
        if (type == Q4_1 || type == Q5_1) u->m = -half_lanes(o + 16 * sbu, half);
    }
}

/* The unit at o (a half unit if `half`: its lanes past 8 hold zero weights, and scales that are finite) */
static inline __attribute__((always_inline)) void unpack_unit(const int type, const uint8_t *o, unit_weights *u,
                                                              const int half) {
    const int sbu = half ? 1 : SB_PER_UNIT, cb = half ? CHUNK / 2 : CHUNK;
    uint8_t bytes[UNIT] __attribute__((aligned(64)));
    unpack_scales(type, o, u, half);
    if (type == Q8_0 && sign_on_activations(type) && !half) { /* its codes where they lie */
        load_signed_weights(u->w, u->sign, (const int8_t *)o + 16 * sbu);
        return;
    }
    for (int c = 0; c < 8; c++) {
        const vw q = weight_chunk(type, o, c, sbu, cb);
        memcpy(bytes + CHUNK * c, &q, CHUNK);
    }
    if (sign_on_activations(type)) /* |q| is the unsigned operand, and q's sign moves onto the activations */
        load_signed_weights(u->w, u->sign, (const int8_t *)bytes);
    else
        load_weights(u->w, bytes);
}

/* A unit's terms t (its BLOCKS lanes) into accumulators [BLOCKS · part, BLOCKS · (part + 1)) of acc. */
static inline vacc acc_add_unit(vacc a, vl t, int part) {
#if CHUNK == 64 /* a unit is the 16 accumulators */
    (void)part;
    return acc_add(a, t);
#else
    enum { PER_UNIT = CHUNK / PIECE_BYTES };
    vpiece p[PER_UNIT];
    memcpy(p, &t, CHUNK);
    for (int i = 0; i < PER_UNIT; i++) a.p[part * PER_UNIT + i] += p[i];
    return a;
#endif
}

enum { MAX_ROWS = 16 };

/* Whether a format's blocks have a min term m·(dx·Σu): Q4_K's and Q5_K's (less), Q4_1's and Q5_1's (plus); Q2_K's
 * dmin·(dx·M) (less). */
static inline int has_min(const int type) {
    return type == Q4_K || type == Q5_K || type == Q4_1 || type == Q5_1 || type == Q2_K;
}

/* Q2_K's M = m₁·Σ₁u + m₂·Σ₂u of each block (its half mins against row x's half sums, one vpmaddwd) as float32, exact:
 * |M| ≤ 2 · 15 · 16 · 127. With VNNI it had been two conversions and products against the half sums' starts (−m / 32
 * a half, exact too), and two more vectors a weight row: on the Zen 4, a Q2_K [8960, 1536] at 2 / 5 / 9 rows then
 * took 1.23 / 1.43 / 1.54x the time of a Q3_K of the shape in the same run, now 0.95 / 0.91 / 1.04x. */
static inline vl q2_k_min_sums(const unit_weights *u, const act_unit *x) {
    vli halves;
    memcpy(&halves, x->halves, CHUNK);
    return __builtin_convertvector(madd_pairs(halves, u->min_pairs), vl);
}

/* A unit's terms against activation row x from its exact block sums: (s·dx)·I, less m·(dx·Σu) for Q4_K and
 * Q5_K, plus it for Q4_1 and Q5_1 (u->m holds their m negated: a − (−b) is a + b, exactly), less dmin·(dx·M) for
 * Q2_K. */
static inline __attribute__((always_inline)) vl float_steps(const int type, const unit_weights *u, vl exact,
                                                            const act_unit *x) {
    vl dx;
    memcpy(&dx, x->dx, CHUNK);
    vl term = (u->s * dx) * exact;
    if (has_min(type)) {
        vl dx_bsum;
        if (type == Q2_K) dx_bsum = dx * q2_k_min_sums(u, x);
        else memcpy(&dx_bsum, x->dx_bsum, CHUNK);
        term = term - u->m * dx_bsum;
    }
    return term;
}

/* The block sums I of Q6_K, Q3_K and Q2_K from their two half sums (started at `half_start_of`), with VNNI and in
 * portable C: sc₁·I₁ + sc₂·I₂ in float32, exact: |sc·I| ≤ 128 · 16 · 32 · 127 and the sum < 2^24. */
static inline vl scaled_halves_sum(const unit_weights *u, vli first, vli second) {
    return __builtin_convertvector(first, vl) * u->half_scale[0] +
           __builtin_convertvector(second, vl) * u->half_scale[1];
}

/* Q5_0's, Q4_0's and (with VNNI) signed codes' block sums I from Σ q·u: less 16, 8 or 128 times Σu, their codes
 * being q − 16, q − 8 and q − 128 (a shift, unsigned: defined for negative sums); the other formats' as they are. */
static inline vli centred(const int type, vli dot, const act_unit *x) {
    const int shift = type == Q5_0 ? 4 : type == Q4_0 ? 3 : signed_codes(type) && SIGNED_OFFSET ? 7 : 0;
    if (!shift) return dot;
    vli sums;
    memcpy(&sums, x->bsum, CHUNK);
    return dot - (vli)((vlu)sums << shift);
}

/* Chunks whose int16 pair sums are added in int16 before widening (see unit_dot): max |w| is 15 for Q4_K, Q4_0
 * and Q4_1, 31 for Q5_0, Q5_1 and Q5_K, 63 for Q6_K, 128 for Q8_0, 127 for IQ4's values; Q3_K's 7 and Q2_K's 3 would
 * take 8, but their halves' scales take 4. */
static inline int sums16_of(const int type) {
    return type == Q4_K || type == Q4_0 || type == Q4_1 ? 8
           : type == Q5_0 || type == Q5_1 || type == Q5_K || type == Q3_K || type == Q2_K ? 4
           : type == Q6_K ? 2 : 1;
}

#if !SCALE_PAIRS
/* Row x's half sums' start for half h of each block: −32·Σu for Q6_K, −4·Σu for Q3_K (a shift, exact: −32·Σu is a
 * multiple of 8), 0 for Q2_K. */
static inline vli half_start_of(const int type, const act_unit *x, int h) {
    if (!half_offset(type)) return (vli){0};
    vli start;
    memcpy(&start, x->half_start[h], CHUNK);
    return start >> (half_offset_shift(Q6_K) - half_offset_shift(type));
}
#endif

/* The terms of a unit against activation row x from unit_dot's sums: I as floats, then the float steps. */
static inline __attribute__((always_inline)) vl dot_terms(const int type, const unit_weights *u, vli dot,
                                                          const act_unit *x) {
#if SCALE_PAIRS
    if (half_offset(type)) { /* less 32 (Q3_K: 4) · (sc₁·Σ₁u + sc₂·Σ₂u); a shift, unsigned: defined for negative sums */
        vli sums;
        memcpy(&sums, x->halves, CHUNK);
        dot -= (vli)((vlu)madd_pairs(sums, u->scale_pairs) << half_offset_shift(type));
    }
#endif
    return float_steps(type, u, __builtin_convertvector(centred(type, dot, x), vl), x);
}

/* The terms of one unpacked unit against one activation row x: its BLOCKS lanes. */
static inline __attribute__((always_inline)) vl unit_terms(const int type, const unit_weights *u, const act_unit *x) {
#if !SCALE_PAIRS
    if (half_scaled(type)) {
        vli half[2] = {half_start_of(type, x, 0), half_start_of(type, x, 1)};
        unit_halves(u->w, x->u, half);
        return float_steps(type, u, scaled_halves_sum(u, half[0], half[1]), x);
    }
#endif
    return dot_terms(type, u, unit_dot(u->w, sign_on_activations(type) ? u->sign : 0, x->u, sums16_of(type),
                                       half_scaled(type) ? u->scale : 0), x);
}

/* One unit of one weight row (a half unit if `half`) against G activation rows: acc[g] += its terms, at
 * accumulators `part`. */
static inline __attribute__((always_inline)) void unit(const int type, const uint8_t *o, const act_unit *a,
                                                       int64_t lda, vacc *acc, int G, int part, const int half) {
    unit_weights u;
    unpack_unit(type, o, &u, half);
    for (int g = 0; g < G; g++) acc[g] = acc_add_unit(acc[g], unit_terms(type, &u, a + g * lda), part);
}

#endif
