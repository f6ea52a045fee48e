package region

import "github.com/quotientlabs/quotient/shares"

// PolicyLimit is the limit the coordinator's share computation uses for a
// global policy now (tests only).
func PolicyLimit(c *Coordinator, id string) (shares.Limit, bool) { return c.policies.Limit(id) }
