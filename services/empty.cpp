// Placeholder translation unit for a service library that has no sources yet.
