package bus

import (
	"encoding/binary"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
)

// newID returns a UUIDv7 (RFC 9562): Unix milliseconds, then 74 random
// bits. The random bits come from math/rand/v2's runtime generator
// (ChaCha8, seeded by the operating system, per thread): ids need to be
// unique and unguessable enough to be unforgeable by accident, not secret,
// and this keeps a system call off every send.
func newID() string { return newIDAt(time.Now()) }

// newIDAt returns a UUIDv7 whose timestamp is now.
func newIDAt(now time.Time) string {
	var u uuid.UUID
	binary.BigEndian.PutUint64(u[0:8], rand.Uint64())
	binary.BigEndian.PutUint64(u[8:16], rand.Uint64())
	ms := uint64(now.UnixMilli())
	u[0], u[1], u[2], u[3], u[4], u[5] = byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms)
	u[6] = u[6]&0x0f | 0x70 // version 7
	u[8] = u[8]&0x3f | 0x80 // variant RFC 9562
	return u.String()
}
