// Fixture for tools/check_layers.sh (ctest Layers.Fixture): model/ including server/ must be reported.
#pragma once
#include "server/ok.h"
#include "../kernels/k.cuh"
