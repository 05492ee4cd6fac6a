package sqlstore

// SetPurgeChunk sets how many rows PurgeDispatched and PurgeProcessed
// delete per statement, so that a test purges a backlog of a few rows in
// several chunks.
func (s *Store) SetPurgeChunk(n int) { s.purgeChunk = n }
