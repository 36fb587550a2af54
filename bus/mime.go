package bus

// ValidImageMIME reports whether s is an image mimeType the fleet passes
// on (into data: URLs and HTTP bodies): image/<type>, no spaces, no CR/LF.
// Tool sources check their results' images with it.
func ValidImageMIME(s string) bool { return imageMimeRE.MatchString(s) }
