package sqlstore

import (
	"strconv"
	"strings"
)

// queries is the SQL of one store, built once with its table names.
type queries struct {
	ddl []ddl

	insertOutbox, claim, claimForUpdate, markDispatched, markFailed string
	purgeOutbox, pendingCount, parkedCount, listParked, requeue     string
	addColumns                                                      []addColumn

	inboxProcessed, inboxInsert, inboxDelete, purgeInbox string
	notify                                               string
}

// Rebind rewrites the ? placeholders of q for d: $1, $2, ... on PostgreSQL,
// unchanged on SQLite.
func (d Dialect) Rebind(q string) string {
	if !d.numberedPlaceholders() {
		return q
	}
	var b strings.Builder
	n := 0
	for i := 0; i < len(q); i++ {
		if q[i] == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(q[i])
	}
	return b.String()
}

const outboxColumns = "id, attempts, message_id, kind, destination, name, content_type, body, correlation_id, sent_at, attrs, headers, due_at"

// ddl creates one table or index, named object (as to_regclass reads it).
type ddl struct {
	object string
	stmt   string
}

// indexObject returns the regclass name of index name, in t's schema.
func indexObject(t Table, name string) string {
	if t.Schema != "" {
		return `"` + t.Schema + `"."` + name + `"`
	}
	return `"` + name + `"`
}

// addColumn is a column added to the outbox table after its first release:
// Migrate adds it to tables created before.
type addColumn struct {
	table Table
	name  string
	def   string // type and constraints
}

func buildQueries(d Dialect, ot, it Table) queries {
	o, i := ot.quoted(), it.quoted()
	idx := func(t Table, suffix string) string { return `"` + t.Name + "_" + suffix + `"` }
	q := queries{
		ddl: []ddl{
			{o, `CREATE TABLE IF NOT EXISTS ` + o + ` (
	id ` + d.serialPrimaryKey() + `,
	message_id TEXT NOT NULL,
	kind SMALLINT NOT NULL,
	destination TEXT NOT NULL,
	name TEXT NOT NULL,
	content_type TEXT NOT NULL,
	body ` + d.blobType() + ` NOT NULL,
	correlation_id TEXT NOT NULL,
	sent_at BIGINT NOT NULL,
	attrs TEXT NOT NULL,
	headers TEXT NOT NULL,
	created_at BIGINT NOT NULL,
	dispatched_at BIGINT,
	attempts INTEGER NOT NULL DEFAULT 0,
	last_error TEXT,
	next_attempt_at BIGINT NOT NULL DEFAULT 0,
	parked_at BIGINT,
	due_at BIGINT NOT NULL DEFAULT 0
)`},
			{indexObject(ot, ot.Name+"_pending"), `CREATE INDEX IF NOT EXISTS ` + idx(ot, "pending") + ` ON ` + o + ` (id) WHERE dispatched_at IS NULL`},
			{indexObject(ot, ot.Name+"_dispatched"), `CREATE INDEX IF NOT EXISTS ` + idx(ot, "dispatched") + ` ON ` + o + ` (dispatched_at) WHERE dispatched_at IS NOT NULL`},
			{i, `CREATE TABLE IF NOT EXISTS ` + i + ` (
	endpoint TEXT NOT NULL,
	message_id TEXT NOT NULL,
	handler TEXT NOT NULL,
	processed_at BIGINT NOT NULL,
	PRIMARY KEY (endpoint, message_id, handler)
)`},
			{indexObject(it, it.Name+"_processed"), `CREATE INDEX IF NOT EXISTS ` + idx(it, "processed") + ` ON ` + i + ` (processed_at)`},
		},
		insertOutbox: `INSERT INTO ` + o + ` (message_id, kind, destination, name, content_type, body, correlation_id, sent_at, attrs, headers, created_at, due_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		claim:          `SELECT ` + outboxColumns + ` FROM ` + o + ` WHERE dispatched_at IS NULL AND parked_at IS NULL AND next_attempt_at <= ? ORDER BY id LIMIT ?`,
		claimForUpdate: `SELECT ` + outboxColumns + ` FROM ` + o + ` WHERE dispatched_at IS NULL AND parked_at IS NULL AND next_attempt_at <= ? ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED`,
		markFailed:     `UPDATE ` + o + ` SET attempts = ?, last_error = ?, next_attempt_at = ?, parked_at = ? WHERE id = ?`,
		purgeOutbox:    `DELETE FROM ` + o + ` WHERE id IN (SELECT id FROM ` + o + ` WHERE dispatched_at IS NOT NULL AND dispatched_at < ? LIMIT ?)`,
		pendingCount:   `SELECT count(*) FROM ` + o + ` WHERE dispatched_at IS NULL AND parked_at IS NULL`,
		parkedCount:    `SELECT count(*) FROM ` + o + ` WHERE dispatched_at IS NULL AND parked_at IS NOT NULL`,
		listParked: `SELECT id, message_id, kind, destination, name, attempts, COALESCE(last_error, ''), created_at, parked_at FROM ` + o +
			` WHERE dispatched_at IS NULL AND parked_at IS NOT NULL AND id > ? ORDER BY id LIMIT ?`,
		requeue: `UPDATE ` + o + ` SET parked_at = NULL, attempts = 0, next_attempt_at = 0 WHERE id = ? AND dispatched_at IS NULL AND parked_at IS NOT NULL`,
		addColumns: []addColumn{
			{ot, "next_attempt_at", "BIGINT NOT NULL DEFAULT 0"},
			{ot, "parked_at", "BIGINT"},
			// The message's bus.Envelope.Due in Unix nanoseconds, 0 for
			// none: the relay hands it to the transport, which carries
			// the delay; the relay never waits for it.
			{ot, "due_at", "BIGINT NOT NULL DEFAULT 0"},
		},
		inboxProcessed: `SELECT 1 FROM ` + i + ` WHERE endpoint = ? AND message_id = ? AND handler = ?`,
		inboxInsert:    `INSERT INTO ` + i + ` (endpoint, message_id, handler, processed_at) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING`,
		inboxDelete:    `DELETE FROM ` + i + ` WHERE endpoint = ? AND message_id = ? AND handler = ?`,
		purgeInbox: `DELETE FROM ` + i + ` WHERE (endpoint, message_id, handler) IN (SELECT endpoint, message_id, handler FROM ` + i +
			` WHERE processed_at < ? LIMIT ?)`,
		notify: `SELECT pg_notify(?, '')`,
	}
	if d.numberedPlaceholders() {
		q.markDispatched = `UPDATE ` + o + ` SET dispatched_at = ?, attempts = attempts + 1 WHERE id = ANY(?)`
	} else {
		q.markDispatched = `UPDATE ` + o + ` SET dispatched_at = ?, attempts = attempts + 1 WHERE id IN (SELECT value FROM json_each(?))`
	}
	for _, p := range []*string{&q.insertOutbox, &q.claim, &q.claimForUpdate, &q.markDispatched, &q.markFailed,
		&q.purgeOutbox, &q.listParked, &q.requeue, &q.inboxProcessed, &q.inboxInsert, &q.inboxDelete, &q.purgeInbox, &q.notify} {
		*p = d.Rebind(*p)
	}
	return q
}
