// keel's native Triton backend: serves one registered LightGBM model version with LightGBM's C library, no Python.
//
// The model repository (gpu_runtime/repository.py) writes <model>-v<N>/<N>/model.txt and meta.json; the config names
// backend "keel_lightgbm". ModelInitialize reads model.txt, refuses to load when it does not hash to meta.json's
// sha256 (a corrupt or tampered file is a failed load; Triton keeps serving what was loaded), and checks the model
// loads; each instance owns its booster (instances run in parallel; a booster is not shared between threads).
//
// Input "features" FP32 [batch, n_features]. Outputs, as the Python backend gave them (gpu_runtime/triton_model.py):
// "score" FP32 [batch, 1] — the probability for a binary model, the value for a regression — and, only for a request
// that asks for them, "contrib" FP64 [batch, n_features + 1] (TreeSHAP: each feature's contribution to the raw
// score, the expected value last) and "raw_score" FP64 [batch, 1]. (A request that names no output is asking for
// all three: Triton requests every output then. The gateway names what it wants.)
// Dynamic batching hands Execute several requests: they are scored in one LightGBM call (the single-row fast path
// when the batch is one row), explained in one more for the rows that asked.
//
// Fault injection (named as such; for drills and the circuit-breaker test): when the config parameter
// keel_fault_file names a file ({version} replaced by the version) and the file exists, requests fail with
// "injected fault": all of them when it is empty (or not a number), else the share its number gives, picked by
// CRC-32 of the request's input bytes — the same inputs as the Python backend failed.
//
// Statistics (per request and per batch) are reported to Triton, so metering reads the same counters as before.

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "digest.h"
#include "files.h"
#include "lightgbm_api.h"
#include "triton_api.h"

namespace {

uint64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

TRITONSERVER_Error* fail(TRITONSERVER_Error_Code code, const std::string& msg) {
  return TRITONSERVER_ErrorNew(code, msg.c_str());
}

void log(TRITONSERVER_LogLevel level, const std::string& msg) {
  TRITONSERVER_Error* err = TRITONSERVER_LogMessage(level, __FILE__, __LINE__, msg.c_str());
  if (err != nullptr) TRITONSERVER_ErrorDelete(err);
}

#define RETURN_IF_ERROR(X)                \
  do {                                    \
    TRITONSERVER_Error* err__ = (X);      \
    if (err__ != nullptr) return err__;   \
  } while (false)

struct ModelState {
  std::string name;
  uint64_t version = 0;
  std::string text;        // the model, byte for byte as registered
  std::string fault_file;  // "" when no fault injection is configured
  int n_features = 0;
};

struct InstanceState {
  BoosterHandle booster = nullptr;
  FastConfigHandle fast = nullptr;  // the single-row path for the score
  ~InstanceState() {
    if (fast != nullptr) LGBM_FastConfigFree(fast);
    if (booster != nullptr) LGBM_BoosterFree(booster);
  }
};

TRITONSERVER_Error* load_booster(const ModelState& m, BoosterHandle* out) {
  int iterations = 0;
  if (LGBM_BoosterLoadModelFromString(m.text.c_str(), &iterations, out) != 0) {
    return fail(TRITONSERVER_ERROR_INVALID_ARG, "model " + m.name + " version " + std::to_string(m.version) +
                                                    ": LightGBM cannot read model.txt: " + LGBM_GetLastError());
  }
  return nullptr;
}

// The share of requests an injected fault fails now: 0 (none: no file), 1 (all), or the file's number.
double fault_share(const std::string& path) {
  std::string text;
  if (path.empty() || !keel::read_file(path, &text)) return 0.0;
  char* end = nullptr;
  const double share = std::strtod(text.c_str(), &end);
  const bool number = end != text.c_str() && text.find_first_not_of(" \t\r\n", end - text.c_str()) == std::string::npos;
  return number ? share : 1.0;  // empty or not a number: fail everything
}

struct Pending {
  TRITONBACKEND_Request* request;
  TRITONSERVER_Error* error = nullptr;
  int64_t rows = 0;
  size_t first_row = 0;  // in the batch's matrix
  size_t first_explained = 0;
  bool explain = false;
};

// Reads one request's input into `x` (row-major FP32) and what it asks for; an error names what is wrong.
TRITONSERVER_Error* gather(Pending* p, int n_features, std::vector<float>* x) {
  TRITONBACKEND_Input* input = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_RequestInput(p->request, "features", &input));
  TRITONSERVER_DataType datatype;
  const int64_t* shape = nullptr;
  uint32_t dims = 0, buffers = 0;
  uint64_t byte_size = 0;
  RETURN_IF_ERROR(TRITONBACKEND_InputProperties(input, nullptr, &datatype, &shape, &dims, &byte_size, &buffers));
  std::string got = "[";
  for (uint32_t i = 0; i < dims; ++i) got += (i ? ", " : "") + std::to_string(shape[i]);
  got += "]";
  if (datatype != TRITONSERVER_TYPE_FP32 || dims != 2 || shape[1] != n_features ||
      byte_size != static_cast<uint64_t>(shape[0]) * n_features * sizeof(float)) {
    return fail(TRITONSERVER_ERROR_INVALID_ARG,
                "features must be FP32 [batch, " + std::to_string(n_features) + "], got " + got);
  }
  p->rows = shape[0];
  p->first_row = x->size() / n_features;
  const size_t start = x->size();
  x->resize(start + shape[0] * n_features);
  char* dst = reinterpret_cast<char*>(x->data() + start);
  for (uint32_t b = 0; b < buffers; ++b) {
    const void* buf = nullptr;
    uint64_t size = 0;
    TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
    int64_t type_id = 0;
    RETURN_IF_ERROR(TRITONBACKEND_InputBuffer(input, b, &buf, &size, &type, &type_id));
    if (type != TRITONSERVER_MEMORY_CPU && type != TRITONSERVER_MEMORY_CPU_PINNED) {
      return fail(TRITONSERVER_ERROR_UNSUPPORTED, "features in GPU memory: keel_lightgbm scores on the CPU");
    }
    std::memcpy(dst, buf, size);
    dst += size;
  }
  uint32_t outputs = 0;
  RETURN_IF_ERROR(TRITONBACKEND_RequestOutputCount(p->request, &outputs));
  for (uint32_t i = 0; i < outputs; ++i) {
    const char* name = nullptr;
    RETURN_IF_ERROR(TRITONBACKEND_RequestOutputName(p->request, i, &name));
    p->explain = p->explain || std::strcmp(name, "contrib") == 0 || std::strcmp(name, "raw_score") == 0;
  }
  return nullptr;
}

template <typename T>
TRITONSERVER_Error* add_output(TRITONBACKEND_Response* response, const char* name, TRITONSERVER_DataType type,
                               int64_t rows, int64_t cols, const T* values) {
  TRITONBACKEND_Output* output = nullptr;
  const int64_t shape[2] = {rows, cols};
  RETURN_IF_ERROR(TRITONBACKEND_ResponseOutput(response, &output, name, type, shape, 2));
  void* buffer = nullptr;
  TRITONSERVER_MemoryType mem = TRITONSERVER_MEMORY_CPU;
  int64_t mem_id = 0;
  const uint64_t bytes = static_cast<uint64_t>(rows * cols) * sizeof(T);
  RETURN_IF_ERROR(TRITONBACKEND_OutputBuffer(output, &buffer, bytes, &mem, &mem_id));
  if (mem != TRITONSERVER_MEMORY_CPU && mem != TRITONSERVER_MEMORY_CPU_PINNED) {
    return fail(TRITONSERVER_ERROR_UNSUPPORTED, std::string("output ") + name + " was given GPU memory");
  }
  std::memcpy(buffer, values, bytes);
  return nullptr;
}

}  // namespace

extern "C" {

TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend*) {
  uint32_t major = 0, minor = 0;
  RETURN_IF_ERROR(TRITONBACKEND_ApiVersion(&major, &minor));
  if (major != KEEL_TRITONBACKEND_API_MAJOR || minor < KEEL_TRITONBACKEND_API_MINOR) {
    return fail(TRITONSERVER_ERROR_UNSUPPORTED,
                "keel_lightgbm needs Triton's backend API " + std::to_string(KEEL_TRITONBACKEND_API_MAJOR) + "." +
                    std::to_string(KEEL_TRITONBACKEND_API_MINOR) + " or a later 1.x; this server has " +
                    std::to_string(major) + "." + std::to_string(minor));
  }
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  auto* m = new ModelState();
  const char* name = nullptr;
  const char* location = nullptr;
  TRITONBACKEND_ArtifactType artifact;
  TRITONSERVER_Error* err = TRITONBACKEND_ModelName(model, &name);
  if (err == nullptr) err = TRITONBACKEND_ModelVersion(model, &m->version);
  if (err == nullptr) err = TRITONBACKEND_ModelRepository(model, &artifact, &location);
  if (err != nullptr) {
    delete m;
    return err;
  }
  m->name = name;
  const std::string dir = std::string(location) + "/" + std::to_string(m->version);
  const std::string what = "model " + m->name + " version " + std::to_string(m->version);
  std::string meta;
  if (!keel::read_file(dir + "/model.txt", &m->text) || !keel::read_file(dir + "/meta.json", &meta)) {
    delete m;
    return fail(TRITONSERVER_ERROR_NOT_FOUND, what + ": model.txt or meta.json missing in " + dir);
  }
  const std::string registered = keel::json_string(meta, "sha256");
  const std::string actual = keel::sha256_hex(m->text);
  if (actual != registered) {
    delete m;
    return fail(TRITONSERVER_ERROR_INVALID_ARG, what + ": model.txt hashes to " + actual.substr(0, 12) +
                                                    ", registered as " + registered.substr(0, 12) +
                                                    " — corrupt or tampered, refusing to load");
  }
  TRITONSERVER_Message* config = nullptr;
  err = TRITONBACKEND_ModelConfig(model, 1, &config);
  if (err == nullptr) {
    const char* json = nullptr;
    size_t size = 0;
    err = TRITONSERVER_MessageSerializeToJson(config, &json, &size);
    if (err == nullptr) {
      const std::string text(json, size);
      const size_t at = text.find("\"keel_fault_file\"");
      if (at != std::string::npos) m->fault_file = keel::json_string(text, "string_value", at);
    }
    TRITONSERVER_MessageDelete(config);
  }
  if (err != nullptr) {
    delete m;
    return err;
  }
  for (size_t at = m->fault_file.find("{version}"); at != std::string::npos; at = m->fault_file.find("{version}"))
    m->fault_file.replace(at, 9, std::to_string(m->version));
  BoosterHandle booster = nullptr;
  err = load_booster(*m, &booster);
  int classes = 0;
  if (err == nullptr && (LGBM_BoosterGetNumFeature(booster, &m->n_features) != 0 ||
                         LGBM_BoosterGetNumClasses(booster, &classes) != 0 || classes != 1)) {
    err = fail(TRITONSERVER_ERROR_UNSUPPORTED, what + ": keel_lightgbm serves single-output models (binary or "
                                                      "regression); this one has " + std::to_string(classes));
  }
  if (booster != nullptr) LGBM_BoosterFree(booster);
  if (err != nullptr) {
    delete m;
    return err;
  }
  log(TRITONSERVER_LOG_INFO, what + ": LightGBM model " + actual.substr(0, 12) + ", " +
                                 std::to_string(m->n_features) + " features" +
                                 (m->fault_file.empty() ? "" : ", fault file " + m->fault_file));
  return TRITONBACKEND_ModelSetState(model, m);
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  void* state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &state));
  delete static_cast<ModelState*>(state);
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance) {
  TRITONBACKEND_Model* model = nullptr;
  void* state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceModel(instance, &model));
  RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &state));
  const auto* m = static_cast<ModelState*>(state);
  auto* s = new InstanceState();
  TRITONSERVER_Error* err = load_booster(*m, &s->booster);
  if (err == nullptr && LGBM_BoosterPredictForMatSingleRowFastInit(s->booster, C_API_PREDICT_NORMAL, 0, -1,
                                                                   C_API_DTYPE_FLOAT32, m->n_features,
                                                                   "num_threads=1", &s->fast) != 0) {
    err = fail(TRITONSERVER_ERROR_INTERNAL, std::string("LightGBM single-row init: ") + LGBM_GetLastError());
  }
  if (err != nullptr) {
    delete s;
    return err;
  }
  return TRITONBACKEND_ModelInstanceSetState(instance, s);
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance) {
  void* state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceState(instance, &state));
  delete static_cast<InstanceState*>(state);
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests, const uint32_t count) {
  const uint64_t exec_start = now_ns();
  TRITONBACKEND_Model* model = nullptr;
  void* mstate = nullptr;
  void* istate = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceModel(instance, &model));
  RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &mstate));
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceState(instance, &istate));
  const auto* m = static_cast<ModelState*>(mstate);
  auto* s = static_cast<InstanceState*>(istate);
  const int nf = m->n_features;

  std::vector<Pending> pending;
  std::vector<float> x;
  const double share = fault_share(m->fault_file);
  for (uint32_t r = 0; r < count; ++r) {
    Pending p{requests[r]};
    const size_t before = x.size();
    p.error = gather(&p, nf, &x);
    if (p.error == nullptr && share > 0.0) {  // injected fault (drills): the whole request, or a share of inputs
      const auto* bytes = reinterpret_cast<const unsigned char*>(x.data() + before);
      const bool failed =
          share >= 1.0 || keel::crc32(bytes, (x.size() - before) * sizeof(float)) % 10000 < share * 10000;
      if (failed) p.error = fail(TRITONSERVER_ERROR_INTERNAL, "injected fault");
    }
    if (p.error != nullptr) x.resize(before);  // its rows take no part in the batch
    pending.push_back(p);
  }

  const uint64_t compute_start = now_ns();
  const int64_t rows = static_cast<int64_t>(x.size()) / nf;
  std::vector<double> score(rows), contrib, raw;
  std::vector<float> xe;  // the rows of requests that asked for explanations
  for (auto& p : pending) {
    if (p.error != nullptr || !p.explain) continue;
    p.first_explained = xe.size() / nf;
    xe.insert(xe.end(), x.begin() + p.first_row * nf, x.begin() + (p.first_row + p.rows) * nf);
  }
  const int64_t explained = static_cast<int64_t>(xe.size()) / nf;
  contrib.resize(explained * (nf + 1));
  raw.resize(explained);
  int64_t len = 0;
  int rc = 0;
  if (rows == 1) {
    rc = LGBM_BoosterPredictForMatSingleRowFast(s->fast, x.data(), &len, score.data());
  } else if (rows > 1) {
    rc = LGBM_BoosterPredictForMat(s->booster, x.data(), C_API_DTYPE_FLOAT32, rows, nf, 1, C_API_PREDICT_NORMAL,
                                   0, -1, "num_threads=1", &len, score.data());
  }
  if (rc == 0 && explained > 0) {
    rc = LGBM_BoosterPredictForMat(s->booster, xe.data(), C_API_DTYPE_FLOAT32, explained, nf, 1,
                                   C_API_PREDICT_CONTRIB, 0, -1, "num_threads=1", &len, contrib.data());
    if (rc == 0)
      rc = LGBM_BoosterPredictForMat(s->booster, xe.data(), C_API_DTYPE_FLOAT32, explained, nf, 1,
                                     C_API_PREDICT_RAW_SCORE, 0, -1, "num_threads=1", &len, raw.data());
  }
  const std::string lgbm_error = rc == 0 ? "" : std::string("LightGBM predict: ") + LGBM_GetLastError();
  const uint64_t compute_end = now_ns();

  std::vector<float> score32(score.begin(), score.end());
  std::vector<bool> ok(pending.size());
  for (size_t i = 0; i < pending.size(); ++i) {
    Pending& p = pending[i];
    if (p.error == nullptr && rc != 0) p.error = fail(TRITONSERVER_ERROR_INTERNAL, lgbm_error);
    TRITONBACKEND_Response* response = nullptr;
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseNew(&response, p.request);
    if (err != nullptr) {  // no response can be made: log it, the request is released below
      log(TRITONSERVER_LOG_ERROR, std::string("cannot create a response: ") + TRITONSERVER_ErrorMessage(err));
      TRITONSERVER_ErrorDelete(err);
      if (p.error != nullptr) TRITONSERVER_ErrorDelete(p.error);
      continue;
    }
    if (p.error == nullptr) {
      p.error = add_output(response, "score", TRITONSERVER_TYPE_FP32, p.rows, 1, score32.data() + p.first_row);
      if (p.error == nullptr && p.explain)
        p.error = add_output(response, "contrib", TRITONSERVER_TYPE_FP64, p.rows, nf + 1,
                             contrib.data() + p.first_explained * (nf + 1));
      if (p.error == nullptr && p.explain)
        p.error = add_output(response, "raw_score", TRITONSERVER_TYPE_FP64, p.rows, 1,
                             raw.data() + p.first_explained);
    }
    ok[i] = p.error == nullptr;
    err = TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, p.error);
    if (err != nullptr) {
      log(TRITONSERVER_LOG_ERROR, std::string("cannot send a response: ") + TRITONSERVER_ErrorMessage(err));
      TRITONSERVER_ErrorDelete(err);
    }
    if (p.error != nullptr) TRITONSERVER_ErrorDelete(p.error);
  }
  const uint64_t exec_end = now_ns();
  uint64_t batch = 0;
  for (size_t i = 0; i < pending.size(); ++i) {
    TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceReportStatistics(
        instance, pending[i].request, ok[i], exec_start, compute_start, compute_end, exec_end);
    if (err != nullptr) TRITONSERVER_ErrorDelete(err);
    if (ok[i]) batch += pending[i].rows;
  }
  if (batch > 0) {
    TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, batch, exec_start,
                                                                               compute_start, compute_end, exec_end);
    if (err != nullptr) TRITONSERVER_ErrorDelete(err);
  }
  for (auto& p : pending) {
    TRITONSERVER_Error* err = TRITONBACKEND_RequestRelease(p.request, TRITONSERVER_REQUEST_RELEASE_ALL);
    if (err != nullptr) {
      log(TRITONSERVER_LOG_ERROR, std::string("cannot release a request: ") + TRITONSERVER_ErrorMessage(err));
      TRITONSERVER_ErrorDelete(err);
    }
  }
  return nullptr;
}

}  // extern "C"
