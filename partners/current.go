package partners

import "sync"

// Current is the partners' configs a reload replaces while a service
// reads them: Set makes parts those of the next Get; a reader goes on with
// the list it got. The zero value holds none.
type Current struct {
	mu    sync.Mutex
	parts []Config
}

// NewCurrent holds parts.
func NewCurrent(parts []Config) *Current { return &Current{parts: parts} }

// Set makes parts (validated) those of the next Get.
func (c *Current) Set(parts []Config) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.parts = parts
}

// Get is the partners as the last Set left them.
func (c *Current) Get() []Config {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.parts
}
