// Fixture for tools/check_layers.sh: server/ may include model/.
#pragma once
#include "model/bad.h"
