// Placeholder so an area with no sources yet still forms a library.
namespace lily { void empty_translation_unit() {} }
