package envelope

// FormatLSN returns lsn as PostgreSQL writes a pg_lsn: the upper and lower
// 32 bits in uppercase hexadecimal without leading zeros, separated by a
// slash ("0/1A2B3C4").
func FormatLSN(lsn uint64) string {
	var b [17]byte
	return string(AppendLSN(b[:0], lsn))
}

// AppendLSN appends lsn formatted as FormatLSN does to dst and returns the
// extended buffer. It never allocates when dst has 17 bytes of room.
func AppendLSN(dst []byte, lsn uint64) []byte {
	dst = appendHex(dst, uint32(lsn>>32))
	dst = append(dst, '/')
	return appendHex(dst, uint32(lsn))
}

func appendHex(dst []byte, v uint32) []byte {
	const digits = "0123456789ABCDEF"
	var b [8]byte
	i := len(b)
	for {
		i--
		b[i] = digits[v&0xF]
		v >>= 4
		if v == 0 {
			break
		}
	}
	return append(dst, b[i:]...)
}
