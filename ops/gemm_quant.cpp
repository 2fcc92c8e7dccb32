// The weight-quantized GEMM drivers (in progress).
#include "ops/quant_weight.h"
