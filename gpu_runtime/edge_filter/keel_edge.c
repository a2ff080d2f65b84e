/* keel's edge filter: a proxy-wasm (ABI 0.2.1) HTTP filter that Envoy runs before the Python gateway sees a request.
 *
 * It authenticates the caller and sets the business labels (seed 000 §3.3):
 *   1. the caller's API key (`x-api-key`, or `Authorization: Bearer …`): `keel_<key id>_<secret>`, checked against the
 *      salted SHA-256 the policy store keeps (keel/tenants.py) — no key → 401, an unknown, wrong or revoked key → 401;
 *   2. the tenant comes from the key, never from the request: any `x-keel-tenant` / `x-keel-edge` the caller sent is
 *      removed, and the filter sets `x-keel-tenant` and `x-keel-edge` (the edge's token: the gateway trusts the
 *      tenant header only with it) and `x-keel-risk-levels` (the tenant's: the gateway holds the body's risk_level
 *      to them);
 *   3. the tier of the model the route names (`/v1/models/<model>/`, or the default model's for `/v1/predict`), the
 *      tier the request asks for (`x-keel-tier`) if any, and its risk level (`x-keel-risk-level`) must each be
 *      among the tenant's, else 403 naming what it may use — on every route; the tier (asked, else the model's) is
 *      set as `x-keel-tier` (Envoy routes L1 at priority HIGH).
 *
 * `GET /healthz`, `/readyz` and `/metrics` pass without a key (probes and scrapes; no tenant is set for them).
 *
 * Its configuration (the plugin configuration, written by keel/edge/filters.py from the policy store) is text, one
 * record a line:  `key <key id> <tenant> <salt hex> <hmac hex>` · `tenant <name> <tiers> <risks>` (comma-separated) ·
 * `model <model> <tier>` · `default model <model>`. A new configuration is a new listener (file xDS): revoking is a commit.
 * It holds no secret, because Envoy's admin endpoint dumps it (`/config_dump`): the edge's token comes from the VM's
 * environment (`KEEL_EDGE_TOKEN`, Envoy's own, passed by `vm_config.environment_variables.host_env_keys`: the dump
 * shows the variable's name only), read through WASI's `environ_get`; and a key's record holds
 * HMAC-SHA256(token, sha256(salt ‖ secret)), not the store's hash — useless without the token.
 *
 * Freestanding C (no libc): built by scripts/setup with zig's clang (the pinned ziglang wheel) for wasm32; never
 * committed as a binary. Memory: a bump arena the host allocates from; reset at the start of each request's headers
 * (nothing is kept across calls but the configuration, copied into its own static store).
 */

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned char u8;
typedef unsigned long size_t;

#define IMPORT(name) __attribute__((import_module("env"), import_name(#name)))
#define EXPORT(name) __attribute__((export_name(#name)))

IMPORT(proxy_log) u32 proxy_log(u32 level, const char *msg, size_t size);
IMPORT(proxy_get_buffer_bytes) u32 proxy_get_buffer_bytes(u32 type, u32 start, u32 length, const char **ptr,
                                                          size_t *size);
IMPORT(proxy_get_header_map_value) u32 proxy_get_header_map_value(u32 type, const char *key, size_t key_size,
                                                                  const char **value, size_t *value_size);
IMPORT(proxy_replace_header_map_value) u32 proxy_replace_header_map_value(u32 type, const char *key, size_t key_size,
                                                                          const char *value, size_t value_size);
IMPORT(proxy_remove_header_map_value) u32 proxy_remove_header_map_value(u32 type, const char *key, size_t key_size);
__attribute__((import_module("wasi_snapshot_preview1"), import_name("environ_sizes_get"))) u32
environ_sizes_get(u32 *count, u32 *size);
__attribute__((import_module("wasi_snapshot_preview1"), import_name("environ_get"))) u32 environ_get(char **env,
                                                                                                      char *buf);
IMPORT(proxy_send_local_response) u32 proxy_send_local_response(u32 code, const char *details, size_t details_size,
                                                                const char *body, size_t body_size,
                                                                const char *headers, size_t headers_size, int grpc);

enum { REQUEST_HEADERS = 0, PLUGIN_CONFIGURATION = 7, CONTINUE = 0, STOP = 1, LOG_WARN = 3 };

/* ---- memory: a bump arena (the host's buffers) and the configuration's own store ---- */
static u8 arena[1 << 20];
static size_t arena_used;

EXPORT(proxy_on_memory_allocate) void *proxy_on_memory_allocate(size_t size) {
  size_t at = (arena_used + 7) & ~(size_t)7;
  if (at + size > sizeof(arena)) return 0;
  arena_used = at + size;
  return arena + at;
}

static void *memcpy_(void *dst, const void *src, size_t n) {
  u8 *d = dst;
  const u8 *s = src;
  while (n--) *d++ = *s++;
  return dst;
}

/* the compiler may emit calls to these for struct copies and loops */
void *memcpy(void *dst, const void *src, size_t n) { return memcpy_(dst, src, n); }
void *memset(void *dst, int c, size_t n) {
  u8 *d = dst;
  while (n--) *d++ = (u8)c;
  return dst;
}

/* ---- SHA-256 (FIPS 180-4) ---- */
static const u32 K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(u32 h[8], const u8 *p) {
  u32 w[64], a, b, c, d, e, f, g, hh;
  for (int i = 0; i < 16; i++) w[i] = (u32)p[4 * i] << 24 | (u32)p[4 * i + 1] << 16 | (u32)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    u32 s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
    u32 s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (int i = 0; i < 64; i++) {
    u32 t1 = hh + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
    u32 t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
}

/* sha256 of a ‖ b (the salt, then the secret) into out[32] */
static void sha256_2(const u8 *a, size_t na, const u8 *b, size_t nb, u8 out[32]) {
  u32 h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  u8 block[64];
  size_t fill = 0;
  u64 total = (u64)(na + nb);
  for (size_t i = 0; i < na + nb; i++) {
    block[fill++] = i < na ? a[i] : b[i - na];
    if (fill == 64) sha256_block(h, block), fill = 0;
  }
  block[fill++] = 0x80;
  if (fill > 56) {
    while (fill < 64) block[fill++] = 0;
    sha256_block(h, block), fill = 0;
  }
  while (fill < 56) block[fill++] = 0;
  u64 bits = total * 8;
  for (int i = 7; i >= 0; i--) block[fill++] = (u8)(bits >> (8 * i));
  sha256_block(h, block);
  for (int i = 0; i < 8; i++)
    out[4 * i] = (u8)(h[i] >> 24), out[4 * i + 1] = (u8)(h[i] >> 16), out[4 * i + 2] = (u8)(h[i] >> 8),
              out[4 * i + 3] = (u8)h[i];
}

/* HMAC-SHA256 (RFC 2104) of a 32-byte message under a key of at most 64 bytes */
static void hmac_sha256(const u8 *key, size_t nkey, const u8 msg[32], u8 out[32]) {
  u8 pad[64], inner[32];
  for (int i = 0; i < 64; i++) pad[i] = (u8)((i < (int)nkey ? key[i] : 0) ^ 0x36);
  sha256_2(pad, 64, msg, 32, inner);
  for (int i = 0; i < 64; i++) pad[i] = (u8)((i < (int)nkey ? key[i] : 0) ^ 0x5c);
  sha256_2(pad, 64, inner, 32, out);
}

/* ---- small string helpers (lengths, never NUL-terminated input) ---- */
static int eq(const char *a, size_t na, const char *b, size_t nb) {
  if (na != nb) return 0;
  for (size_t i = 0; i < na; i++)
    if (a[i] != b[i]) return 0;
  return 1;
}
static size_t slen(const char *s) {
  size_t n = 0;
  while (s[n]) n++;
  return n;
}
static int hexval(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}
static int unhex(const char *s, size_t n, u8 *out) { /* n hex digits → n/2 bytes; 0 on a bad digit */
  for (size_t i = 0; i + 1 < n; i += 2) {
    int hi = hexval(s[i]), lo = hexval(s[i + 1]);
    if (hi < 0 || lo < 0) return 0;
    out[i / 2] = (u8)(hi << 4 | lo);
  }
  return 1;
}
/* a comma-separated list holds the item? */
static int listed(const char *list, size_t n, const char *item, size_t ni) {
  size_t start = 0;
  for (size_t i = 0; i <= n; i++) {
    if (i == n || list[i] == ',') {
      if (eq(list + start, i - start, item, ni)) return 1;
      start = i + 1;
    }
  }
  return 0;
}

/* ---- the configuration: records of whitespace-separated fields, kept in a static store ---- */
#define MAX_CONFIG (256 * 1024)
#define MAX_RECORDS 4096
typedef struct {
  const char *f[5];
  size_t n[5];
  int count;
} record;
static char config[MAX_CONFIG];
static record records[MAX_RECORDS];
static int nrecords;

static int parse_config(const char *text, size_t size) {
  if (size >= MAX_CONFIG) return 0;
  memcpy_(config, text, size);
  nrecords = 0;
  size_t i = 0;
  while (i < size && nrecords < MAX_RECORDS) {
    record *r = &records[nrecords];
    r->count = 0;
    while (i < size && config[i] != '\n') {
      while (i < size && (config[i] == ' ' || config[i] == '\t')) i++;
      if (i >= size || config[i] == '\n') break;
      size_t s = i;
      while (i < size && config[i] != ' ' && config[i] != '\t' && config[i] != '\n') i++;
      if (r->count < 5) r->f[r->count] = config + s, r->n[r->count] = i - s, r->count++;
    }
    i++;
    if (r->count) nrecords++;
  }
  return 1;
}

static const record *find(const char *kind, const char *key, size_t nkey) {
  size_t nk = slen(kind);
  for (int i = 0; i < nrecords; i++)
    if (records[i].count >= 2 && eq(records[i].f[0], records[i].n[0], kind, nk) &&
        eq(records[i].f[1], records[i].n[1], key, nkey))
      return &records[i];
  return 0;
}

EXPORT(proxy_abi_version_0_2_1) void proxy_abi_version_0_2_1(void) {}
EXPORT(proxy_on_context_create) void proxy_on_context_create(u32 context_id, u32 parent) {}
EXPORT(proxy_on_vm_start) u32 proxy_on_vm_start(u32 root, u32 size) { return 1; }
EXPORT(proxy_on_done) u32 proxy_on_done(u32 context_id) { return 1; }
EXPORT(proxy_on_log) void proxy_on_log(u32 context_id) {}
EXPORT(proxy_on_delete) void proxy_on_delete(u32 context_id) {}

/* the edge's token, from the VM's environment (KEEL_EDGE_TOKEN); 0 bytes: none (every request is then 503) */
#define MAX_TOKEN 64
static char token[MAX_TOKEN];
static size_t ntoken;

static void read_token(void) {
  static char buf[4096];
  static char *env[64];
  u32 count = 0, size = 0;
  ntoken = 0;
  if (environ_sizes_get(&count, &size) != 0 || count > 64 || size > sizeof(buf)) return;
  if (environ_get(env, buf) != 0) return;
  const char *name = "KEEL_EDGE_TOKEN=";
  size_t nname = slen(name);
  for (u32 i = 0; i < count; i++) {
    size_t n = slen(env[i]);
    if (n > nname && n - nname <= MAX_TOKEN && eq(env[i], nname, name, nname)) {
      memcpy_(token, env[i] + nname, n - nname);
      ntoken = n - nname;
    }
  }
}

EXPORT(proxy_on_configure) u32 proxy_on_configure(u32 root, u32 size) {
  const char *data = 0;
  size_t n = 0;
  arena_used = 0;
  read_token();
  if (proxy_get_buffer_bytes(PLUGIN_CONFIGURATION, 0, size, &data, &n) != 0 || !parse_config(data, n)) {
    const char *msg = "keel edge: the configuration could not be read";
    proxy_log(LOG_WARN, msg, slen(msg));
    return 0;
  }
  return 1;
}

/* ---- answers ---- */
static u32 answer(u32 code, const char *error, const char *message, size_t nmessage) {
  static char body[512];
  static char pairs[64];
  size_t n = 0;
  const char *parts[] = {"{\"error\": \"", error, "\", \"message\": \""};
  for (int p = 0; p < 3; p++)
    for (const char *c = parts[p]; *c && n < 400; c++) body[n++] = *c;
  for (size_t i = 0; i < nmessage && n < 480; i++) body[n++] = message[i] == '"' ? '\'' : message[i];
  body[n++] = '"', body[n++] = '}';
  /* one header pair: content-type: application/json (count, key size, value size, key\0, value\0) */
  const char *k = "content-type", *v = "application/json";
  u32 nk = (u32)slen(k), nv = (u32)slen(v), one = 1;
  size_t m = 0;
  memcpy_(pairs + m, &one, 4), m += 4;
  memcpy_(pairs + m, &nk, 4), m += 4;
  memcpy_(pairs + m, &nv, 4), m += 4;
  memcpy_(pairs + m, k, nk), m += nk, pairs[m++] = 0;
  memcpy_(pairs + m, v, nv), m += nv, pairs[m++] = 0;
  proxy_send_local_response(code, error, slen(error), body, n, pairs, m, -1);
  return STOP;
}

static int header(const char *name, const char **value, size_t *n) {
  *value = 0, *n = 0;
  return proxy_get_header_map_value(REQUEST_HEADERS, name, slen(name), value, n) == 0 && *n > 0;
}
static void set_header(const char *name, const char *value, size_t n) {
  proxy_replace_header_map_value(REQUEST_HEADERS, name, slen(name), value, n);
}

/* /healthz, /readyz or /metrics, with or without a query */
static int operations_path(const char *p, size_t n) {
  const char *names[] = {"/healthz", "/readyz", "/metrics"};
  for (int i = 0; i < 3; i++) {
    size_t m = slen(names[i]);
    if (n >= m && eq(p, m, names[i], m) && (n == m || p[m] == '?')) return 1;
  }
  return 0;
}

/* 403: "tenant <name> may use <what> <given>, not <asked>" */
static u32 not_given(const record *t, const char *what, const char *given, size_t ngiven, const char *asked,
                     size_t nasked) {
  static char msg[256];
  size_t m = 0;
  const char *parts[] = {"tenant ", t->f[1], " may use ", what, " ", given, ", not ", asked};
  size_t sizes[] = {7, t->n[1], 9, slen(what), 1, ngiven, 6, nasked};
  for (int p = 0; p < 8; p++)
    for (size_t i = 0; i < sizes[p] && m < sizeof(msg); i++) msg[m++] = parts[p][i];
  return answer(403, "forbidden", msg, m);
}

EXPORT(proxy_on_request_headers) u32 proxy_on_request_headers(u32 context_id, u32 nheaders, u32 end_of_stream) {
  const char *v;
  size_t n;
  arena_used = 0;
  /* what only the edge may say is never taken from the caller */
  proxy_remove_header_map_value(REQUEST_HEADERS, "x-keel-tenant", 13);
  proxy_remove_header_map_value(REQUEST_HEADERS, "x-keel-edge", 11);
  proxy_remove_header_map_value(REQUEST_HEADERS, "x-keel-risk-levels", 18);
  /* the operations' reads (health probes, metrics scrapes) need no key: they carry no tenant's data in or out */
  if (header(":method", &v, &n) && eq(v, n, "GET", 3) && header(":path", &v, &n) && operations_path(v, n))
    return CONTINUE;
  const char *key = 0;
  size_t nkey = 0;
  if (header("x-api-key", &v, &n)) key = v, nkey = n;
  else if (header("authorization", &v, &n) && n > 7 && eq(v, 7, "Bearer ", 7)) key = v + 7, nkey = n - 7;
  if (!key) {
    const char *m = "an API key is required: x-api-key: keel_… or Authorization: Bearer keel_…";
    return answer(401, "unauthenticated", m, slen(m));
  }
  /* keel_<12 hex>_<43> */
  const record *k = 0;
  if (nkey == 5 + 12 + 1 + 43 && eq(key, 5, "keel_", 5) && key[17] == '_') k = find("key", key + 5, 12);
  u8 salt[16], want[32], got[32];
  int ok = k && k->count == 5 && k->n[3] == 32 && k->n[4] == 64 && unhex(k->f[3], 32, salt) && unhex(k->f[4], 64, want);
  if (ok && ntoken == 0) {
    const char *m = "the edge has no token (KEEL_EDGE_TOKEN in its environment)";
    return answer(503, "edge_misconfigured", m, slen(m));
  }
  if (ok) {
    u8 hashed[32];
    sha256_2(salt, 16, (const u8 *)key + 18, 43, hashed);
    hmac_sha256((const u8 *)token, ntoken, hashed, got);
    u8 diff = 0;
    for (int i = 0; i < 32; i++) diff |= got[i] ^ want[i];
    ok = diff == 0;
  }
  if (!ok) {
    const char *m = "unknown or revoked API key";
    return answer(401, "unauthenticated", m, slen(m));
  }
  const record *t = find("tenant", k->f[2], k->n[2]);
  if (!t || t->count < 4) {
    const char *m = "the edge's configuration names no such tenant";
    return answer(503, "edge_misconfigured", m, slen(m));
  }
  /* the model the route names — /v1/models/<model>/…, or the default model for /v1/predict — and its tier, held to the
   * tenant's tiers on every route; a tier asked for (x-keel-tier) is held to them too */
  const record *m = 0;
  if (header(":path", &v, &n) && n > 11 && eq(v, 11, "/v1/models/", 11)) {
    size_t s = 11, e = 11;
    while (e < n && v[e] != '/' && v[e] != '?') e++;
    m = find("model", v + s, e - s);
  } else if (n >= 11 && eq(v, 11, "/v1/predict", 11) && (n == 11 || v[11] == '?' || v[11] == '/')) {
    const record *d = find("default", "model", 5);
    if (d && d->count >= 3) m = find("model", d->f[2], d->n[2]);
  }
  if (m && m->count >= 3 && !listed(t->f[2], t->n[2], m->f[2], m->n[2]))
    return not_given(t, "tiers", t->f[2], t->n[2], m->f[2], m->n[2]);
  const char *tier = 0;
  size_t ntier = 0;
  if (header("x-keel-tier", &v, &n)) tier = v, ntier = n;
  else if (m && m->count >= 3) tier = m->f[2], ntier = m->n[2];
  if (tier && !listed(t->f[2], t->n[2], tier, ntier)) return not_given(t, "tiers", t->f[2], t->n[2], tier, ntier);
  if (header("x-keel-risk-level", &v, &n) && !listed(t->f[3], t->n[3], v, n))
    return not_given(t, "risk levels", t->f[3], t->n[3], v, n);
  set_header("x-keel-tenant", t->f[1], t->n[1]);
  set_header("x-keel-risk-levels", t->f[3], t->n[3]); /* the gateway holds the body's risk_level to them */
  set_header("x-keel-edge", token, ntoken);
  if (tier) set_header("x-keel-tier", tier, ntier);
  return CONTINUE;
}
