/* safetensors.c -- (being written) */
#include "model/safetensors.h"
