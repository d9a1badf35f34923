#pragma once
// Everything needed to define and update metrics; include this one header.
// See builder.h for an example and registry.h for the registration rules.

#include "src/metrics/builder.h"
#include "src/metrics/counter.h"
#include "src/metrics/family.h"
#include "src/metrics/gauge.h"
#include "src/metrics/histogram.h"
#include "src/metrics/registry.h"
#include "src/metrics/text_serializer.h"
