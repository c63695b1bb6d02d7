// Human-readable rendering of a core::Plan for `flatshard plan`.
#ifndef FLATSHARD_CLIENT_PLAN_PRINTER_H_
#define FLATSHARD_CLIENT_PLAN_PRINTER_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "core/plan.h"

namespace flatshard {

// "1.50 MiB", "512 B".
std::string HumanBytes(int64_t bytes);

void PrintPlan(const Plan& plan, std::ostream& out);

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_PLAN_PRINTER_H_
