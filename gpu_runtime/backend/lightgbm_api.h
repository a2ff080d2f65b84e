// The parts of LightGBM's C API (lib_lightgbm.so, shipped in the lightgbm wheel) that keel's Triton backend calls,
// declared here from LightGBM's C API documentation (lightgbm.readthedocs.io, "C API"). Every function returns 0 on
// success and -1 on failure, with the reason in LGBM_GetLastError().
#pragma once

#include <cstdint>

extern "C" {

typedef void* BoosterHandle;
typedef void* FastConfigHandle;

constexpr int C_API_DTYPE_FLOAT32 = 0;
constexpr int C_API_PREDICT_NORMAL = 0;     // with the objective's transform: a probability for binary
constexpr int C_API_PREDICT_RAW_SCORE = 1;  // before it: log-odds for binary
constexpr int C_API_PREDICT_CONTRIB = 3;    // TreeSHAP: one value per feature, then the expected value

const char* LGBM_GetLastError();
int LGBM_BoosterLoadModelFromString(const char* model_str, int* out_num_iterations, BoosterHandle* out);
int LGBM_BoosterFree(BoosterHandle handle);
int LGBM_BoosterGetNumFeature(BoosterHandle handle, int* out_len);
int LGBM_BoosterGetNumClasses(BoosterHandle handle, int* out_len);
int LGBM_BoosterPredictForMat(BoosterHandle handle, const void* data, int data_type, int32_t nrow, int32_t ncol,
                              int is_row_major, int predict_type, int start_iteration, int num_iteration,
                              const char* parameter, int64_t* out_len, double* out_result);
int LGBM_BoosterPredictForMatSingleRowFastInit(BoosterHandle handle, int predict_type, int start_iteration,
                                               int num_iteration, int data_type, int32_t ncol,
                                               const char* parameter, FastConfigHandle* out_fast_config);
int LGBM_BoosterPredictForMatSingleRowFast(FastConfigHandle fast_config, const void* data, int64_t* out_len,
                                           double* out_result);
int LGBM_FastConfigFree(FastConfigHandle fast_config);

}  // extern "C"
