package ledgerpg

import (
	"strings"

	"github.com/budgetgen/budgetgen/internal/ledger"
)

// PostgreSQL's text holds no U+0000 ("invalid byte sequence for encoding
// UTF8: 0x00", https://www.postgresql.org/docs/current/datatype-character.html:
// "the character with code zero ... cannot be stored"), yet a principal's
// value may hold one: it is valid UTF-8, all decide.Validate asks of a value.
// A principal column therefore holds the ledger's field with each NUL
// written `\0`. No field ledger.EncodePrincipal writes has that escape: a
// single value with a backslash is escaped, and each backslash of an escaped
// field starts `\\`, `\,`, `\e` or `\#`. So the stored form of a field
// without NUL is the field itself (rows synced before stay theirs), and
// reading the escapes pairwise gives every field back.

// storedPrincipal is the principal column of a ledger field.
func storedPrincipal(field string) string {
	if !strings.Contains(field, "\x00") {
		return field
	}
	return strings.ReplaceAll(field, "\x00", `\0`)
}

// fieldOf reverses storedPrincipal.
func fieldOf(stored string) string {
	if !strings.Contains(stored, `\0`) {
		return stored
	}
	var b strings.Builder
	for i := 0; i < len(stored); i++ {
		if stored[i] == '\\' && i+1 < len(stored) {
			i++
			if stored[i] == '0' {
				b.WriteByte(0)
				continue
			}
			b.WriteByte('\\')
		}
		b.WriteByte(stored[i])
	}
	return b.String()
}

// displayName is the principal_name column of a ledger field: its
// ledger.PrincipalName, with each NUL shown as U+FFFD (the replacement
// character), since the column, for people, is not read back.
func displayName(field string) string {
	return strings.ReplaceAll(ledger.PrincipalName(field), "\x00", "\uFFFD")
}
