// Fixture for tools/check_layers.sh: kernels/ including model/ through a relative path must be reported.
#pragma once
#include "../model/bad.h"
