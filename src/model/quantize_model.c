/* quantize_model.c -- (being written) */
#include "model/safetensors.h"
